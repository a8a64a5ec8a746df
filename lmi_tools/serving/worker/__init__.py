"""The worker socket: the front end's client, the worker process, DJL's wire codec and how Java builds an Input."""
