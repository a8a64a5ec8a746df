#!/usr/bin/env bash
# The SageMaker path of docs/sagemaker.md ("Try it offline"), step by step, with no AWS account: moto plays
# S3 and the SageMaker control plane, `lmi serve` plays the endpoint's container behind SageMaker Runtime.
# package -> lmi upload -> lmi deploy (autoscaled) -> (SageMaker's part) -> lmi invoke, plain and streamed ->
# lmi delete; then two inference components: their plan, and lmi serve playing their endpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh
PYTHON=${PYTHON:-.venv/bin/python}
lmi() { "$PYTHON" -m lmi_tools "$@"; }
OUT=${OUT:-out/sagemaker-demo}
MOTO_PORT=${MOTO_PORT:-5055}
PORT=${PORT:-8080}
BUCKET=my-lmi-artifacts
ROLE=arn:aws:iam::123456789012:role/SageMakerRole
rm -rf "$OUT" && mkdir -p "$OUT"

# serve LOG ARGS...: start `lmi serve ARGS --port $PORT` in the background as $SERVER and wait for /ping.
serve() {
  local log=$1; shift
  "$PYTHON" -m lmi_tools serve "$@" --port "$PORT" > "$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 120); do
    kill -0 $SERVER 2>/dev/null || { cat "$log"; exit 1; }
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/ping")" = 200 ] && return
    sleep 0.5
  done
}

# Dummy credentials and a region: nothing here reaches AWS.
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1

echo "--- 1. a model directory and its model.tar.gz"
lmi tiny-model "$OUT/model"
printf 'engine=Python\noption.entryPoint=lmi_handlers.entrypoint\noption.rolling_batch=scheduler\noption.max_new_tokens=32\n' \
  > "$OUT/model/serving.properties"
lmi package "$OUT/model" -o "$OUT/model.tar.gz" --instance g5.xlarge   # validated, lmi_handlers vendored
lmi inspect "$OUT/model.tar.gz"

echo "--- 2. moto's S3 and SageMaker on 127.0.0.1:$MOTO_PORT, and a bucket"
"$PYTHON" -m moto.server -H 127.0.0.1 -p "$MOTO_PORT" > "$OUT/moto.log" 2>&1 &
MOTO=$!
SERVER=
trap 'kill $MOTO ${SERVER:-} 2>/dev/null; wait 2>/dev/null || true' EXIT
export AWS_ENDPOINT_URL=http://127.0.0.1:$MOTO_PORT
for _ in $(seq 1 50); do curl -s -o /dev/null "$AWS_ENDPOINT_URL" && break; sleep 0.2; done
"$PYTHON" -c "import boto3; boto3.client('s3').create_bucket(Bucket='$BUCKET')"   # aws s3 mb s3://$BUCKET

echo "--- 3. upload and deploy"
ARTIFACT=$(lmi upload "$OUT/model.tar.gz" "s3://$BUCKET/tiny/")
lmi deploy --artifact "$ARTIFACT" --instance ml.g4dn.xlarge --role "$ROLE" --name tiny-ep --dry-run > "$OUT/plan.json"
lmi deploy --artifact "$ARTIFACT" --instance ml.g4dn.xlarge --role "$ROLE" --name tiny-ep --poll-interval 1 \
  --autoscale 1:2 --target-metric invocations --target-value 100

echo "--- 4. SageMaker's part: copy the model data to /opt/ml/model and start the container"
"$PYTHON" -c "import boto3; boto3.client('s3').download_file('$BUCKET', 'tiny/model.tar.gz', '$OUT/downloaded.tar.gz')"
mkdir -p "$OUT/opt-ml-model/tiny-ep" && tar -C "$OUT/opt-ml-model/tiny-ep" -xzf "$OUT/downloaded.tar.gz"
serve "$OUT/serve.log" "$OUT/opt-ml-model/tiny-ep" --sagemaker-part-size 5

echo "--- 5. invoke: plain, streamed, and DJLServing's own /predictions for comparison"
ASK=(--prompt "The quick brown fox" --parameters '{"max_new_tokens": 16}' --endpoint-url "http://127.0.0.1:$PORT")
lmi invoke tiny-ep "${ASK[@]}"
lmi invoke tiny-ep "${ASK[@]}" --stream
curl -s -X POST "http://127.0.0.1:$PORT/predictions/tiny-ep" -H 'Content-Type: application/json' \
  -d '{"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 16}}'
echo

echo "--- 6. delete the scaling policy and target, the endpoint, its config, its model and the artifact"
lmi delete tiny-ep --all

echo "--- 7. inference components: the plan (dry run: moto has none) and lmi serve playing endpoint 'pool'"
lmi deploy --artifact "$ARTIFACT" --instance ml.g5.12xlarge --role "$ROLE" --name pool --component chat \
  --model-dir "$OUT/model" --dry-run > "$OUT/plan-component.json"
kill $SERVER && wait $SERVER 2>/dev/null || true
serve "$OUT/serve-pool.log" "chat=$OUT/opt-ml-model/tiny-ep" "code=$OUT/opt-ml-model/tiny-ep" --endpoint pool
lmi invoke pool --component chat "${ASK[@]}"
lmi invoke pool --component code "${ASK[@]}" --stream
