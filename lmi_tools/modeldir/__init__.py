"""Writing a model directory: the spec, its rendering, serving.properties reading and packaged resources."""
