package app_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
)

const checkHead = `
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
[server]
admin_token = "0123456789abcdef"
[[sources]]
name = "items"
database = "shop"
[[rules]]
name = "all"
source = "items"
sinks = ["s"]
[[sinks]]
name = "s"
`

// TestCheckRunParity: for every sink type, what the config accepts, Check
// and BuildSinks (what run does) build, and what run's sinks would refuse,
// the config already refuses with the key and file:line — in particular
// the options that check used to pass and run refused.
func TestCheckRunParity(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	tests := []struct {
		name, sink string
		err        string // "" when valid
	}{
		{"webhook", `type = "webhook"
url = "https://example.com/hook"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
bearer_token = "t"`, ""},
		{"webhook raw secret", `type = "webhook"
url = "https://example.com/hook"
secrets = ["0123456789abcdefghijklmnop", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
basic_auth = { username = "u", password = "p" }`, ""},
		{"webhook bearer and Authorization", `type = "webhook"
url = "https://example.com/hook"
bearer_token = "t"
headers = { Authorization = "Bearer x" }`, "sinks[0].headers.Authorization: conflicts with bearer_token (line 17): set the credentials once at check.toml:18"},
		{"webhook 1-byte secret", `type = "webhook"
url = "https://example.com/hook"
secret = "k"`, `sinks[0].secret: the signing key is 1 bytes, want at least 24 random bytes (e.g. "whsec_" + the output of openssl rand -base64 32) at check.toml:17`},
		{"webhook short whsec", `type = "webhook"
url = "https://example.com/hook"
secret = "whsec_c2hvcnQ"`, `sinks[0].secret: the signing key is 5 bytes, want at least 24 random bytes (e.g. "whsec_" + the output of openssl rand -base64 32) at check.toml:17`},
		{"eventbridge", `type = "eventbridge"
event_bus = "orders"
endpoint = "http://127.0.0.1:1"`, ""},
		{"sqs", `type = "sqs"
queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/audit.fifo"`, ""},
		{"sqs by name", `type = "sqs"
queue_name = "audit"
region = "eu-west-1"`, ""},
		{"kinesis", `type = "kinesis"
stream = "changes"
partition_key = "fullDocument.customerId"
max_request_bytes = 10485760
batch_size = 500`, ""},
		{"kinesis by ARN", `type = "kinesis"
stream = "arn:aws:kinesis:eu-west-1:123456789012:stream/changes"
region = "eu-west-1"
oversize = "strip"`, ""},
		{"kinesis bad partition key", `type = "kinesis"
stream = "changes"
partition_key = "fullDocument."`, `sinks[0].partition_key: must be a dotted field path like "fullDocument.customerId", got "fullDocument." at check.toml:17`},
		{"sns fifo", `type = "sns"
topic_arn = "arn:aws:sns:us-east-1:123456789012:changes.fifo"
message_group_id = "fullDocument.customerId"
max_request_bytes = 1048576`, ""},
		{"sns", `type = "sns"
topic_arn = "arn:aws:sns:us-east-1:123456789012:changes"
endpoint = "http://127.0.0.1:1"`, ""},
		{"kafka", `type = "kafka"
brokers = ["kafka-1:9092", "kafka-2:9093"]
topic = "cdc.{db}.{coll}"`, ""},
		{"kafka sasl tls", `type = "kafka"
brokers = ["b-1.msk.example.com:9096"]
topic = "{source}"
tls = true
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "cg"
sasl_password = "pw"
max_request_bytes = 2000000`, ""},
		{"kafka bad topic", `type = "kafka"
brokers = ["k:9092"]
topic = "cdc/{db}"`, `sinks[0].topic: character '/' is not allowed in a Kafka topic name (use letters, digits, ".", "_" and "-") at check.toml:17`},
		{"lambda", `type = "lambda"
function = "arn:aws:lambda:us-east-1:123456789012:function:step1:live"
invocation_type = "RequestResponse"
client_context = '{"custom": {"a": 1}}'
batch_size = 10
oversize = "strip"`, ""},
		{"lambda unknown invocation type", `type = "lambda"
function = "step1"
invocation_type = "Async"`, `sinks[0].invocation_type: invalid value "Async"; allowed values: "Event", "RequestResponse" at check.toml:17`},
		{"lambda bad function", `type = "lambda"
function = "step 1"`, `sinks[0].function: invalid function "step 1": use a function name ("step1"), name:alias ("step1:live"), ARN ("arn:aws:lambda:us-east-1:123456789012:function:step1") or partial ARN ("123456789012:function:step1") at check.toml:16`},
		{"webhook sigv4", `type = "webhook"
url = "https://abc123.lambda-url.eu-west-1.on.aws/"
auth = "aws_sigv4"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"`, ""},
		{"webhook sigv4 with basic_auth", `type = "webhook"
url = "https://abc123.lambda-url.eu-west-1.on.aws/"
auth = "aws_sigv4"
basic_auth = { username = "u", password = "p" }`, `sinks[0].basic_auth: cannot be combined with auth = "aws_sigv4" (line 17): SigV4 sets the Authorization header at check.toml:18`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := config.Parse("check.toml", []byte(checkHead+tt.sink+"\n"), func(string) (string, bool) { return "", false })
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("config error\n got %v\nwant %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("config: %v", err)
			}
			if err := app.Check(cfg); err != nil {
				t.Fatalf("Check: %v", err)
			}
			specs, err := app.BuildSinks(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatalf("BuildSinks (run) refuses what check accepts: %v", err)
			}
			for _, s := range specs {
				_ = s.Sink.Close()
			}
		})
	}
}

// TestCheckBuildsSinks: Check runs the sinks' own validation, so a problem
// only a sink constructor finds (here a config built in code, past the
// parser) fails check as it fails run.
func TestCheckBuildsSinks(t *testing.T) {
	cfg, err := config.Parse("check.toml", []byte(checkHead+`type = "webhook"
url = "https://example.com/hook"
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	cfg.Sinks[0].Webhook.URL = "ftp://example.com/"
	err = app.Check(cfg)
	if err == nil || !strings.Contains(err.Error(), "sinks[0]: sink s: webhook s: url: scheme must be http or https") || !strings.Contains(err.Error(), "check.toml") {
		t.Fatalf("Check = %v", err)
	}
	if _, err := app.BuildSinks(cfg, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("BuildSinks accepted what Check refused")
	}
}

// TestPushdownNotes: check says which filters stay in changegate and why.
func TestPushdownNotes(t *testing.T) {
	cfg, err := config.Parse("check.toml", []byte(`
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
[[sources]]
name = "items"
[[sinks]]
name = "s"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "plain"
source = "items"
filter = { "fullDocument.code" = { "$regex" = "^[A-Z]{3}$" } }
sinks = ["s"]
[[rules]]
name = "redos"
source = "items"
filter = { "fullDocument.name" = { "$regex" = "^(a+)+$" } }
sinks = ["s"]
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	notes := app.PushdownNotes(cfg)
	if len(notes) != 1 || !strings.HasPrefix(notes[0], `rules[1] (redos): filter evaluated in changegate only, not pushed down to MongoDB: pattern "^(a+)+$" at fullDocument.name: `) {
		t.Errorf("notes = %q", notes)
	}
}
