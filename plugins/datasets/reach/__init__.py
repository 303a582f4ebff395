"""The embedded reach task: a scripted 2-D reach dataset generated on the fly."""
