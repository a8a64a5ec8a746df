# DJLServing's LMI image for Inferentia2/Trainium (transformers-neuronx inside), plus lmi_handlers.
#   docker build -f docker/neuronx.Dockerfile -t lmi-handlers:neuronx .
# SageMaker's copy of the base image works too:
#   --build-arg BASE_IMAGE=763104351884.dkr.ecr.<region>.amazonaws.com/djl-inference:0.29.0-neuronx-sdk2.19.1
ARG BASE_IMAGE=deepjavalibrary/djl-serving:0.29.0-pytorch-inf2
FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="lmi-handlers-neuronx" \
      org.opencontainers.image.description="DJLServing LMI (transformers-neuronx) with the lmi_handlers runtime"

# Only the runtime goes in: it needs nothing but the standard library (torch, transformers and
# transformers_neuronx come with the image), so it is copied rather than pip-installed - no
# dependency of the image changes, and the code is exactly the tested source tree.
COPY lmi_handlers /opt/lmi-handlers/lmi_handlers

# DJLServing's Python workers inherit the environment: the package imports from anywhere, and a
# model directory needs no model.py (serving.properties may still name another entry point).
ENV PYTHONPATH=/opt/lmi-handlers \
    OPTION_ENTRYPOINT=lmi_handlers.entrypoint \
    NEURON_COMPILE_CACHE_URL=/var/tmp/neuron-compile-cache
