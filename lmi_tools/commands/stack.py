"""``lmi chat-stack``: the CloudFormation stack of one EC2 host serving the chat page (write the template, print
the create-stack line, or create the stack)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("chat-stack")(chat_stack)


def chat_stack(
    models: list[str] = typer.Argument(..., help="[NAME=]s3://bucket/key/model.tar.gz, or [NAME=]DIR (a model directory: "
                                                  "the lmi package and lmi upload lines are printed too); the first is "
                                                  "loaded at start, the page switches to the others"),
    key_name: str = typer.Option(..., "--key-name", help="EC2 key pair for SSH"),
    wheel: str = typer.Option(..., "--wheel", help="s3:// URI of the lmi-handlers wheel, in the artifacts' bucket"),
    instance: str = typer.Option("inf2.xlarge", "--instance", help="inf2.xlarge, inf2.8xlarge or g5.xlarge..."),
    stack_name: str = typer.Option("lmi-chat", help="CloudFormation stack name"),
    volume_size: int = typer.Option(120, help="Root EBS volume in GiB (at least 80)"),
    vpc_id: str = typer.Option("", help="An existing VPC (default: a new VPC with one public subnet)"),
    subnet_id: str = typer.Option("", help="A public subnet of --vpc-id"),
    allowed_cidr: str = typer.Option("0.0.0.0/0", help="Who may reach ports 8080 and 22 (the server has no "
                                                        "authentication: narrow it to your address)"),
    image: str = typer.Option("", help="LMI image (default: DJLServing 0.29.0's for the instance family)"),
    template: Path = typer.Option(Path("lmi-chat-host.yaml"), help="Where to write the template"),
    deploy: bool = typer.Option(False, "--deploy", help="Create the stack with boto3 instead of printing the line"),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region (default: your profile's)"),
    profile: Optional[str] = typer.Option(None, "--profile", help="AWS profile"),
) -> None:
    """Write the one-host CloudFormation template and print its aws cloudformation create-stack line.

    Example: lmi chat-stack llama=s3://b/llama/model.tar.gz code=s3://b/code/model.tar.gz
    --wheel s3://b/lmi_handlers-0.1.0-py3-none-any.whl --key-name mykey --instance inf2.xlarge
    """
    from ..errors import UsageError
    from ..ec2.chat_stack import ChatStack, bucket_of, parse_model, prepare_lines, template_text

    sources = [parse_model(m, bucket_of(wheel, "--wheel"), stack_name) for m in models]
    stack = ChatStack(stack_name=stack_name, instance=instance, key_name=key_name,
                      models=tuple((name, uri) for name, uri, _ in sources), wheel=wheel, volume_size=volume_size,
                      vpc_id=vpc_id, subnet_id=subnet_id, allowed_cidr=allowed_cidr, image=image)
    stack.check()
    local = [source for source in sources if source[2] is not None]
    if deploy and local:
        raise UsageError(f"{local[0][2]} is a local directory: its artifact must be in S3 before the stack is created",
                         hint="run without --deploy for the lmi package / lmi upload lines, then pass the S3 URIs")
    if deploy:
        from ..sagemaker import aws

        sess = aws.session(region, profile)
        with aws.aws_errors("creating the stack"):
            stack_id = stack.create(aws.client(sess, "cloudformation"))
        typer.echo(f"created {stack_id}\nabout 15-30 minutes to CREATE_COMPLETE, then the first model loads; the URL:\n"
                   f"  aws cloudformation describe-stacks --stack-name {stack_name} "
                   "--query 'Stacks[0].Outputs[?OutputKey==`Url`].OutputValue' --output text")
        return
    template.write_text(template_text(), encoding="utf-8")
    typer.echo(f"# wrote {template}; never deployed by lmi-handlers' authors (docs/ec2-chat-host.md)", err=True)
    for name, uri, directory in local:
        typer.echo("\n".join(prepare_lines(name, uri, directory)))
    typer.echo(stack.create_stack_line(template))
