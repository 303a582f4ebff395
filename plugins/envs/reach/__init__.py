"""The embedded reach task as a closed-loop environment: the dataset's dynamics, camera and expert."""
