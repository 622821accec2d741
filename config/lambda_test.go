package config

import (
	"reflect"
	"testing"
	"time"
)

func TestLambdaSink(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"
[[sinks]]
name = "step1"
type = "lambda"
function = "step1"
[[sinks]]
name = "step2"
type = "lambda"
function = "arn:aws:lambda:eu-west-1:123456789012:function:step2:live"
qualifier = "live"
invocation_type = "RequestResponse"
client_context = '{"custom": {"from": "changegate"}}'
batch_size = 20
region = "eu-west-1"
role_arn = "arn:aws:iam::123456789012:role/changegate"
[[sinks]]
name = "step3"
type = "lambda"
function = "123456789012:function:step3"
invocation_type = "RequestResponse"
timeout = "5m"
max_request_bytes = 100000
oversize = "strip"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		batch int
		l     LambdaSink
	}{
		{1, LambdaSink{AWS: AWS{MaxRequestBytes: 1 << 20, Timeout: 10 * time.Second}, Function: "step1", InvocationType: "Event"}},
		{20, LambdaSink{AWS: AWS{Region: "eu-west-1", RoleARN: "arn:aws:iam::123456789012:role/changegate", MaxRequestBytes: 6 << 20, Timeout: time.Minute},
			Function: "arn:aws:lambda:eu-west-1:123456789012:function:step2:live", Qualifier: "live", InvocationType: "RequestResponse",
			ClientContext: `{"custom": {"from": "changegate"}}`}},
		{1, LambdaSink{AWS: AWS{MaxRequestBytes: 100000, Timeout: 5 * time.Minute}, Function: "123456789012:function:step3", InvocationType: "RequestResponse"}},
	}
	for i, w := range want {
		s := cfg.Sinks[i]
		if s.BatchSize != w.batch || s.Lambda == nil || !reflect.DeepEqual(*s.Lambda, w.l) || s.Webhook != nil {
			t.Errorf("%s: batch %d %+v\nwant %d %+v", s.Name, s.BatchSize, s.Lambda, w.batch, w.l)
		}
	}
	if cfg.Sinks[2].Oversize != OversizeStrip {
		t.Error("oversize")
	}
}

func TestWebhookSigV4(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"
[[sinks]]
name = "url"
type = "webhook"
url = "https://abcdefghij.lambda-url.eu-central-1.on.aws/"
auth = "aws_sigv4"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
[[sinks]]
name = "api"
type = "webhook"
url = "https://xyz.execute-api.us-west-2.amazonaws.com/prod/hooks"
auth = "aws_sigv4"
aws_service = "execute-api"
role_arn = "arn:aws:iam::123456789012:role/changegate"
[[sinks]]
name = "internal"
type = "webhook"
url = "https://hooks.example.com/"
auth = "aws_sigv4"
region = "ap-south-1"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range []struct{ service, region, role string }{
		{"lambda", "eu-central-1", ""},
		{"execute-api", "us-west-2", "arn:aws:iam::123456789012:role/changegate"},
		{"lambda", "ap-south-1", ""},
	} {
		h := cfg.Sinks[i].Webhook
		if h.Auth != WebhookAuthSigV4 || h.AWSService != w.service || h.Region != w.region || h.RoleARN != w.role {
			t.Errorf("%s: %+v", cfg.Sinks[i].Name, h)
		}
	}
	if len(cfg.Sinks[0].Webhook.Secrets) != 1 {
		t.Error("the Standard Webhooks secret is kept with SigV4")
	}
}

func TestLambdaAndSigV4Errors(t *testing.T) {
	for _, tt := range []struct{ name, toml, want string }{
		{"lambda", head + `
[[sinks]]
name = "a"
type = "lambda"
[[sinks]]
name = "b"
type = "lambda"
function = ""
invocation_type = "Sync"
[[sinks]]
name = "c"
type = "lambda"
function = "arn:aws:sqs:us-east-1:123456789012:queue"
[[sinks]]
name = "d"
type = "lambda"
function = "step1:live"
qualifier = "prod"
client_context = "[1]"
max_request_bytes = 2000000
[[sinks]]
name = "e"
type = "lambda"
function = "my function"
qualifier = "a/b"
url = "https://example.com/"
batch_size = 1001
`, `sinks[0].function: required key is missing at config.toml:4
sinks[1].function: must not be empty: use a function name ("step1"), name:alias ("step1:live"), ARN ("arn:aws:lambda:us-east-1:123456789012:function:step1") or partial ARN ("123456789012:function:step1") at config.toml:10
sinks[1].invocation_type: invalid value "Sync"; allowed values: "Event", "RequestResponse" at config.toml:11
sinks[2].function: invalid function "arn:aws:sqs:us-east-1:123456789012:queue": use a function name ("step1"), name:alias ("step1:live"), ARN ("arn:aws:lambda:us-east-1:123456789012:function:step1") or partial ARN ("123456789012:function:step1") at config.toml:15
sinks[3].qualifier: "prod" differs from the qualifier "live" in function (line 19): set it once at config.toml:20
sinks[3].client_context: must be a JSON object, like '{"custom": {"source": "changegate"}}' at config.toml:21
sinks[3].max_request_bytes: must be between 1024 and 1048576, got 2000000 at config.toml:22
sinks[4].function: invalid function "my function": use a function name ("step1"), name:alias ("step1:live"), ARN ("arn:aws:lambda:us-east-1:123456789012:function:step1") or partial ARN ("123456789012:function:step1") at config.toml:26
sinks[4].qualifier: invalid qualifier "a/b": use a version number, "$LATEST" or an alias name (letters, digits, "-" and "_", at most 128) at config.toml:27
sinks[4].url: not an option of lambda sinks at config.toml:28
sinks[4].batch_size: must be between 1 and 1000, got 1001 at config.toml:29`},
		{"sigv4", head + `
[[sinks]]
name = "a"
type = "webhook"
url = "https://hooks.example.com/"
auth = "aws_sigv4"
bearer_token = "t"
[[sinks]]
name = "b"
type = "webhook"
url = "https://abc.lambda-url.us-east-1.on.aws/"
auth = "aws_sigv4"
aws_service = "Lambda"
  [sinks.basic_auth]
  username = "u"
  password = "p"
  [sinks.headers]
  X-Amz-Date = "x"
[[sinks]]
name = "c"
type = "webhook"
url = "https://hooks.example.com/"
auth = "sigv4"
region = "us-east-1"
[[sinks]]
name = "d"
type = "webhook"
url = "https://hooks.example.com/"
aws_service = "lambda"
role_arn = "arn:aws:iam::1:user/x"
`, `sinks[0].region: required with auth = "aws_sigv4": the url is not a function URL (*.lambda-url.<region>.on.aws) or execute-api host to take the region from at config.toml:8
sinks[0].bearer_token: cannot be combined with auth = "aws_sigv4" (line 8): SigV4 sets the Authorization header at config.toml:9
sinks[1].aws_service: invalid service "Lambda": use a SigV4 signing name like "lambda" or "execute-api" at config.toml:15
sinks[1].basic_auth: cannot be combined with auth = "aws_sigv4" (line 14): SigV4 sets the Authorization header at config.toml:16
sinks[1].headers: header X-Amz-Date cannot be set with auth = "aws_sigv4" (line 14): SigV4 sets it at config.toml:19
sinks[2].auth: invalid value "sigv4"; allowed values: "aws_sigv4" at config.toml:25
sinks[3].aws_service: applies only with auth = "aws_sigv4" at config.toml:31
sinks[3].role_arn: applies only with auth = "aws_sigv4" at config.toml:32
sinks[3].role_arn: must be an IAM role ARN like "arn:aws:iam::123456789012:role/changegate", got "arn:aws:iam::1:user/x" at config.toml:32`},
		{"sigv4 path", head + `
[[sinks]]
name = "a"
type = "webhook"
url = "https://abc.lambda-url.us-east-1.on.aws/a//b/./c/../d"
auth = "aws_sigv4"
[[sinks]]
name = "b"
type = "webhook"
url = "https://xyz.execute-api.us-west-2.amazonaws.com/prod/%2E%2E/hooks"
auth = "aws_sigv4"
aws_service = "execute-api"
[[sinks]]
name = "c"
type = "webhook"
url = "https://xyz.execute-api.us-west-2.amazonaws.com/prod//hooks"
auth = "aws_sigv4"
[[sinks]]
name = "d"
type = "webhook"
url = "https://bucket.s3.us-west-2.amazonaws.com/a//b/./c"
auth = "aws_sigv4"
aws_service = "s3"
region = "us-west-2"
[[sinks]]
name = "e"
type = "webhook"
url = "https://xyz.execute-api.us-west-2.amazonaws.com/prod/hooks/?a=..&b=//"
auth = "aws_sigv4"
[[sinks]]
name = "f"
type = "webhook"
url = "https://hooks.example.com/a//b"
`, `sinks[0].url: the path has an empty segment ("//"): with auth = "aws_sigv4" (line 8) AWS normalizes the path before it checks the signature (every service but s3), so the request would be refused; write the path in normal form at config.toml:7
sinks[1].url: the path has a ".." segment: with auth = "aws_sigv4" (line 13) AWS normalizes the path before it checks the signature (every service but s3), so the request would be refused; write the path in normal form at config.toml:12
sinks[2].url: the path has an empty segment ("//"): with auth = "aws_sigv4" (line 19) AWS normalizes the path before it checks the signature (every service but s3), so the request would be refused; write the path in normal form at config.toml:18`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("config.toml", src(tt.toml), nil)
			if err == nil || err.Error() != tt.want {
				t.Errorf("got:\n%v\nwant:\n%s", err, tt.want)
			}
		})
	}
}
