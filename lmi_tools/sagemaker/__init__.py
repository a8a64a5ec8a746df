"""SageMaker hosting with boto3: upload an artifact, deploy it on an LMI image, invoke it (streaming
included), delete it. The ``lmi upload / deploy / invoke / delete / components / scale``
commands call these modules:

* ``images``: the LMI image URI for an instance type (the sagemaker SDK's table when installed, else ours);
* ``upload``: ``model.tar.gz`` or a directory to S3 (multipart, progress, never "folder" keys);
* ``deploy``: create_model, create_endpoint_config, create_endpoint as a plan (``--dry-run`` prints it), then wait;
* ``scaling``: Application Auto Scaling of a variant's instances or a component's copies;
* ``components``: inference components (several models on one endpoint), sized by ``lmi validate``;
* ``invoke``: invoke_endpoint and invoke_endpoint_with_response_stream, with line reassembly;
* ``delete``: scaling and components first, then the endpoint and, on request, its config, models and S3 artifacts;
* ``calls``: one boto3 call as data, so that ``--dry-run`` prints what is later sent;
* ``aws``: sessions, clients, and the translation of AWS failures into one-line errors with a hint.
"""
