"""Running on an EC2 host: the ``docker run`` line for the LMI images."""
