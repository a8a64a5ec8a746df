# DJLServing's LMI image for NVIDIA GPUs (G5 and friends), plus lmi_handlers (transformers backend).
#   docker build -f docker/gpu.Dockerfile -t lmi-handlers:gpu .
# SageMaker's copy of the base image works too:
#   --build-arg BASE_IMAGE=763104351884.dkr.ecr.<region>.amazonaws.com/djl-inference:0.29.0-lmi11.0.0-cu124
ARG BASE_IMAGE=deepjavalibrary/djl-serving:0.29.0-lmi
FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="lmi-handlers-gpu" \
      org.opencontainers.image.description="DJLServing LMI (GPU) with the lmi_handlers runtime"

# Standard-library-only runtime: copied, not pip-installed (see neuronx.Dockerfile).
COPY lmi_handlers /opt/lmi-handlers/lmi_handlers

ENV PYTHONPATH=/opt/lmi-handlers \
    OPTION_ENTRYPOINT=lmi_handlers.entrypoint
