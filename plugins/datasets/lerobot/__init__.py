"""The LeRobot v3.0 dataset reader."""
