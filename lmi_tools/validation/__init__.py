"""``lmi validate``: a model directory checked against its model and instance before anything is deployed."""
