package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// testBusType is a second sink type, standing in for the AWS sinks of a
// later issue, to test options that belong to another type.
var testBusType = sinkType{
	name:         "testbus",
	maxBatchSize: 10,
	decode: func(d *decoder, o *obj, s *Sink) {
		o.reqString("event_bus")
		o.optString("region", "")
	},
}

// parseWith parses like Parse, with the test sink type registered too.
func parseWith(filename string, data []byte, env map[string]string) (*Config, error) {
	d := &decoder{file: filename, lookupEnv: envOf(env), sinkTypes: append(builtinSinkTypes(), testBusType)}
	return d.parse(data)
}

// head is a valid start of a config, two lines long.
const head = `
[mongo]
uri = "mongodb://localhost"
`

func TestBadConfigs(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.txt")
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		toml string
		env  map[string]string
		want string // every error, one per line
	}{
		// head is lines 1-2 and line 3 is empty: a case's own lines start at 4.
		{"unknown key with did-you-mean", head + `
[[sources]]
name = "orders"
database = "shop"
colection = "orders"
`, nil, `sources[0].colection: unknown key (did you mean "collection"?) at config.toml:7`},

		{"white-space admin token", head + `
[server]
admin_token = "  "
`, nil, `server.admin_token: is only white space: set a real token, or leave it empty to disable mutating admin API calls at config.toml:5`},

		{"short admin token and secrets", head + `
[server]
admin_token = "abc"
[[sinks]]
name = "a"
type = "webhook"
url = "https://example.com/"
secret = "x"
[[sinks]]
name = "b"
type = "webhook"
url = "https://example.com/"
secrets = ["whsec_c2hvcnQ", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
`, nil, `server.admin_token: is 3 characters, want at least 16 (e.g. the output of openssl rand -hex 16) at config.toml:5
sinks[0].secret: the signing key is 1 bytes, want at least 24 random bytes (e.g. "whsec_" + the output of openssl rand -base64 32) at config.toml:10
sinks[1].secrets[0]: the signing key is 5 bytes, want at least 24 random bytes (e.g. "whsec_" + the output of openssl rand -base64 32) at config.toml:15`},

		{"credentials twice", head + `
[[sinks]]
name = "a"
type = "webhook"
url = "https://example.com/"
bearer_token = "t"
headers = { Authorization = "Bearer other" }
[[sinks]]
name = "b"
type = "webhook"
url = "https://example.com/"
headers = { "authorization" = "x" }
basic_auth = { username = "a:b", password = "p" }
`, nil, `sinks[0].headers.Authorization: conflicts with bearer_token (line 8): set the credentials once at config.toml:9
sinks[1].headers.authorization: conflicts with basic_auth (line 15): set the credentials once at config.toml:14
sinks[1].basic_auth.username: must not contain ":" (HTTP basic authentication separates it from the password with one) at config.toml:15`},

		{"bad allowed hosts", head + `
[server]
public_read = "yes"
allowed_hosts = ["changegate.example", "https://x.example", "a.example:9464", "", "two words", 7]
`, nil, `server.public_read: expected a boolean (true or false), got string at config.toml:5
server.allowed_hosts[5]: expected a string, got integer at config.toml:6`},

		{"bad console keys", head + `
[server]
console = "yes"
console_auth = "tokens"
`, nil, `server.console: expected a boolean (true or false), got string at config.toml:5
server.console_auth: invalid value "tokens" (did you mean "token"?); allowed values: "none", "token" at config.toml:6`},

		{"console_auth token without admin_token", head + `
[server]
console_auth = "token"
`, nil, `server.console_auth: is "token" but server.admin_token is not set: set the token the console's pages then need, or console_auth = "none" at config.toml:5`},

		{"bad allowed host names", head + `
[server]
allowed_hosts = ["changegate.example", "https://x.example", "a.example:9464", "", "two words"]
`, nil, `server.allowed_hosts[1]: "https://x.example": want a host name such as "changegate.example.com", without scheme at config.toml:5
server.allowed_hosts[2]: "a.example:9464": want a host name without port (any port is accepted) at config.toml:5
server.allowed_hosts[3]: must not be empty at config.toml:5
server.allowed_hosts[4]: "two words" is not a host name at config.toml:5`},

		{"unknown table and missing mongo", `
[mongodb]
uri = "mongodb://localhost"
`, nil, `mongo.uri: required key is missing at config.toml
mongodb: unknown key (did you mean "mongo"?) at config.toml:1`},

		{"wrong type for a duration", head + `
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
timeout = 10
`, nil, `sinks[0].timeout: expected a duration string like "10s", got integer at config.toml:8`},

		{"wrong types", head + `
[server]
listen = 9464
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
max_in_flight = "16"
allow_private_networks = "yes"
headers = ["X-A: b"]
`, nil, `server.listen: expected a string, got integer at config.toml:5
sinks[0].max_in_flight: must be "auto" or a number (without quotes), got "16" at config.toml:10
sinks[0].allow_private_networks: expected a boolean (true or false), got string at config.toml:11
sinks[0].headers: expected a table, got array at config.toml:12`},

		{"concurrency and rate limits", head + `
[[sinks]]
name = "a"
type = "webhook"
url = "https://example.com/"
max_in_flight = "fast"
max_in_flight_min = 0
rate_limit = "fast"
rate_limit_burst = 0
[[sinks]]
name = "b"
type = "webhook"
url = "https://example.com/"
max_in_flight_min = 64
max_in_flight_max = 32
rate_limit = "0/s"
[[sinks]]
name = "c"
type = "webhook"
url = "https://example.com/"
max_in_flight_min = 2000
rate_limit = -5
[[sinks]]
name = "d"
type = "webhook"
url = "https://example.com/"
max_in_flight = 8
max_in_flight_max = 100
rate_limit_burst = 10
[[sinks]]
name = "e"
type = "webhook"
url = "https://example.com/"
max_in_flight = true
rate_limit = "-5/s"
`, nil, `sinks[0].max_in_flight: must be "auto" or a number (without quotes), got "fast" at config.toml:8
sinks[0].max_in_flight_min: must be at least 1, got 0 at config.toml:9
sinks[0].rate_limit: "fast" is not a rate like "500/s" at config.toml:10
sinks[0].rate_limit_burst: must be at least 1, got 0 at config.toml:11
sinks[1].max_in_flight_max: must not be less than max_in_flight_min (64), got 32 at config.toml:17
sinks[1].rate_limit: "0/s": the count must be at least 1 at config.toml:18
sinks[2].rate_limit: expected a string, got integer at config.toml:24
sinks[3].max_in_flight_max: applies only when max_in_flight is "auto" at config.toml:30
sinks[3].rate_limit_burst: needs rate_limit at config.toml:31
sinks[4].max_in_flight: expected "auto" or an integer, got boolean at config.toml:36
sinks[4].rate_limit: "-5/s": the count must be at least 1 at config.toml:37`},

		{"circuit cooldown out of range", head + `
[[sinks]]
name = "a"
type = "webhook"
url = "https://example.com/"
circuit_max_cooldown = "500ms"
[[sinks]]
name = "b"
type = "webhook"
url = "https://example.com/"
circuit_max_cooldown = "2h"
`, nil, `sinks[0].circuit_max_cooldown: must be at least 1s, got 500ms at config.toml:8
sinks[1].circuit_max_cooldown: must be at most 1h0m0s, got 2h0m0s at config.toml:13`},

		{"mongo uri the driver rejects", `
[mongo]
uri = "mongodb://localhost/?maxPoolSize=lots"
`, nil, `mongo.uri: invalid connection string: error parsing uri: invalid value for "maxPoolSize": "lots" at config.toml:2`},

		{"mongo uri password never quoted", `
[mongo]
uri = "mongodb://user:hunter2%zz@localhost/"
`, nil, `mongo.uri: invalid connection string: error parsing uri: invalid password: not a valid percent-encoding (the password is not shown) at config.toml:2`},

		{"listen port out of range", head + `
[server]
listen = "127.0.0.1:99999"
`, nil, `server.listen: invalid address "127.0.0.1:99999": the port must be a number from 0 to 65535 at config.toml:5`},

		{"missing required keys", head + `
[[sources]]
database = "shop"

[[sinks]]
name = "hook"

[[rules]]
name = "r"
`, nil, `sources[0].name: required key is missing at config.toml:4
sinks[0].type: required key is missing at config.toml:7
rules[0].source: required key is missing at config.toml:10
rules[0].sinks: required key is missing at config.toml:10`},

		{"bad enum values", head + `
[[sources]]
name = "orders"
full_document = "updatelookup"
on_history_lost = "ignore"
[[sinks]]
name = "hook"
type = "webhok"
url = "https://example.com/"
`, nil, `sources[0].full_document: invalid value "updatelookup" (did you mean "updateLookup"?); allowed values: "default", "updateLookup", "whenAvailable", "required" at config.toml:6
sources[0].on_history_lost: invalid value "ignore"; allowed values: "fail", "resume_from_now" at config.toml:7
sinks[0].type: invalid value "webhok" (did you mean "webhook"?); allowed values: "webhook", "eventbridge", "sqs", "lambda", "kinesis", "sns", "kafka", "testbus" at config.toml:10`},

		{"bad cluster", head + `
[cluster]
enabled = "yes"
lease_ttl = "2s"
instance = " "
leases_collection = "checkpoints"
leese_ttl = "15s"
`, nil, `cluster.enabled: expected a boolean (true or false), got string at config.toml:5
cluster.lease_ttl: must be at least 3s, got 2s at config.toml:6
cluster.instance: must not be empty (omit it to use $HOSTNAME or a random id) at config.toml:7
cluster.leases_collection: must differ from mongo.checkpoint_collection and mongo.deadletter_collection at config.toml:8
cluster.leese_ttl: unknown key (did you mean "lease_ttl"?) at config.toml:9`},

		{"bad delivery_log", head + `
[delivery_log]
mode = "failure"
retention = "30s"
collection = "deadletters"
mod = "all"
`, nil, `delivery_log.mode: invalid value "failure" (did you mean "failures"?); allowed values: "failures", "all", "off" at config.toml:5
delivery_log.retention: must be at least 1m0s, got 30s at config.toml:6
delivery_log.collection: must differ from mongo.checkpoint_collection, mongo.deadletter_collection (and its _fences) and cluster.leases_collection at config.toml:7
delivery_log.mod: unknown key (did you mean "mode"?) at config.toml:8`},

		{"delivery_log beside the leases, retention too long", head + `
[cluster]
leases_collection = "owners"
[delivery_log]
retention = "600000h"
collection = "owners"
[delivery_log.x]
`, nil, `delivery_log.retention: must be at most 596523h14m7s, got 600000h0m0s at config.toml:7
delivery_log.collection: must differ from mongo.checkpoint_collection, mongo.deadletter_collection (and its _fences) and cluster.leases_collection at config.toml:8
delivery_log.x: unknown key at config.toml:9`},

		{"renew_every not below half the ttl", head + `
[cluster]
lease_ttl = "10s"
renew_every = "5s"
`, nil, `cluster.renew_every: must be less than half of lease_ttl (5s), got 5s at config.toml:6`},

		{"renew_every against the default ttl", head + `
[cluster]
renew_every = "0s"
[server]
[cluster.x]
`, nil, `cluster.renew_every: must be at least 1ms, got 0s at config.toml:5
cluster.x: unknown key at config.toml:7`},

		{"partitions out of range", head + `
[[sources]]
name = "a"
partitions = 0
[[sources]]
name = "b"
partitions = 257
[[sources]]
name = "c"
partitions = "4"
`, nil, `sources[0].partitions: must be between 1 and 256, got 0 at config.toml:6
sources[1].partitions: must be between 1 and 256, got 257 at config.toml:9
sources[2].partitions: expected an integer, got string at config.toml:12`},

		{"bad durations", head + `
[server]
shutdown_grace = "30 seconds"
[[sources]]
name = "orders"
max_await = "-1s"
checkpoint_interval = "0s"
`, nil, `server.shutdown_grace: invalid duration "30 seconds": use a number and a unit (ms, s, m, h), e.g. "10s" at config.toml:5
sources[0].max_await: must not be negative, got -1s at config.toml:8
sources[0].checkpoint_interval: must be at least 1ms, got 0s at config.toml:9`},

		{"duplicate names", head + `
[[sources]]
name = "orders"
[[sources]]
name = "orders"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.org/"
[[rules]]
name = "r"
source = "orders"
sinks = ["hook"]
[[rules]]
name = "r"
source = "orders"
sinks = ["hook"]
`, nil, `sources[1].name: duplicate source name "orders" (first defined at line 5) at config.toml:7
sinks[1].name: duplicate sink name "hook" (first defined at line 9) at config.toml:13
rules[1].name: duplicate rule name "r" (first defined at line 17) at config.toml:21`},

		{"unknown sink and source references", head + `
[[sources]]
name = "orders"
[[sinks]]
name = "audit"
type = "webhook"
url = "https://example.com/"
[[rules]]
name = "r"
source = "order"
sinks = [
  "audit",
  "audit-q",
  "billing",
]
`, nil, `rules[0].source: unknown source "order" (did you mean "orders"?) at config.toml:12
rules[0].sinks: unknown sink "audit-q" (did you mean "audit"?) at config.toml:15
rules[0].sinks: unknown sink "billing" at config.toml:16`},

		{"bad filter operator", head + `
[[sources]]
name = "orders"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
[[rules]]
name = "r"
source = "orders"
filter = { "fullDocument.total" = { "$gtx" = 5 } }
sinks = ["hook"]
`, nil, `rules[0].filter: invalid filter: unknown operator $gtx at fullDocument.total at config.toml:13`},

		{"bad pipeline JSON", head + `
[[sources]]
name = "orders"
pipeline = '[{"$match": }]'
[[sources]]
name = "more"
pipeline = '[{"$lookup": {}}, 3]'
`, nil, `sources[0].pipeline: invalid Extended JSON array of stages: error decoding key 0: invalid JSON input; unexpected } at position 12 at config.toml:6
sources[1].pipeline: stage 0: $lookup is not allowed in a change stream; allowed stages: $addFields, $match, $project, $replaceRoot, $replaceWith, $redact, $set, $unset, $changeStreamSplitLargeEvent at config.toml:9
sources[1].pipeline: stage 1: must be a document at config.toml:9`},

		{"large event options", head + `
[[sources]]
name = "orders"
split_large_events = "on"
on_oversize_event = "drop"
pipeline = '[{"$changeStreamSplitLargeEvent": {}}, {"$project": {"fullDocument": 0}}]'
[[sources]]
name = "ok"
pipeline = '[{"$match": {"operationType": "insert"}}, {"$changeStreamSplitLargeEvent": {}}]'
[[sources]]
name = "spec"
pipeline = '[{"$changeStreamSplitLargeEvent": {"maxSize": 1}}]'
[[sources]]
name = "twice"
pipeline = '[{"$changeStreamSplitLargeEvent": {}}, {"$changeStreamSplitLargeEvent": 1}]'
`, nil, `sources[0].split_large_events: invalid value "on"; allowed values: "auto", "off" at config.toml:6
sources[0].on_oversize_event: invalid value "drop"; allowed values: "fail", "skip" at config.toml:7
sources[0].pipeline: stage 0: $changeStreamSplitLargeEvent must be the last stage of the pipeline (MongoDB refuses it anywhere else) at config.toml:8
sources[2].pipeline: stage 0: $changeStreamSplitLargeEvent takes an empty document, {} at config.toml:14
sources[3].pipeline: stage 0: $changeStreamSplitLargeEvent must be the last stage of the pipeline (MongoDB refuses it anywhere else) at config.toml:17
sources[3].pipeline: stage 1: $changeStreamSplitLargeEvent takes an empty document, {} at config.toml:17`},

		{"bad snapshot", head + `
[[sources]]
name = "orders"
snapshot = "always"
[[sources]]
name = "ok"
snapshot = "initial"
[[sources]]
name = "both"
start_at = "2026-11-22T10:00:00Z"
snapshot = "initial"
`, nil, `sources[0].snapshot: invalid value "always"; allowed values: "never", "initial" at config.toml:6
sources[2].snapshot: "initial" cannot be combined with start_at: a snapshot continues with the stream from the position it takes before the scan at config.toml:13`},

		{"bad oversize", head + `
[[sinks]]
name = "bus"
type = "eventbridge"
event_bus = "b"
region = "us-east-1"
oversize = "truncate"
`, nil, `sinks[0].oversize: invalid value "truncate"; allowed values: "deadletter", "strip" at config.toml:9`},

		{"bad transactions", head + `
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
transactions = "grouped"
`, nil, `sinks[0].transactions: invalid value "grouped" (did you mean "group"?); allowed values: "none", "group" at config.toml:8`},

		{"unset environment variables", `
[mongo]
uri = "${MONGODB_URI}"
[server]
admin_token = "${TOKEN:-}"
listen = "${ADDR"
`, nil, `mongo.uri: environment variable MONGODB_URI is not set at config.toml:2
server.listen: unterminated "${" (write "$${" for a literal "${") at config.toml:5`},

		{"missing secret file", head + `
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
secret = "file:` + missing + `"
`, nil, `sinks[0].secret: cannot read secret file: open ` + missing + `: no such file or directory at config.toml:8`},

		{"CA files", head + `
[[sinks]]
name = "a"
type = "webhook"
url = "https://example.com/"
tls_ca_file = "` + missing + `"
[[sinks]]
name = "b"
type = "webhook"
url = "https://example.com/"
tls_ca_file = "` + notPEM + `"
`, nil, `sinks[0].tls_ca_file: cannot read CA file: open ` + missing + `: no such file or directory at config.toml:8
sinks[1].tls_ca_file: no PEM certificate found in ` + notPEM + ` at config.toml:13`},

		{"collection without database", head + `
[[sources]]
name = "orders"
collection = "orders"
`, nil, `sources[0].collection: requires database (a collection is watched within a database) at config.toml:6`},

		{"key of another sink type", head + `
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
event_bus = "orders"
[[sinks]]
name = "bus"
type = "testbus"
event_bus = "orders"
url = "https://example.com/"
`, nil, `sinks[0].event_bus: not an option of webhook sinks at config.toml:8
sinks[1].url: not an option of testbus sinks at config.toml:13`},

		{"eventbridge options", head + `
[[sinks]]
name = "bus"
type = "eventbridge"
event_bus = "orders bus"
region = "US East"
endpoint = "localhost:4566"
role_arn = "changegate"
source = "aws.{source}"
detail_type = "{db}.{operationtype}"
resources = ["bucket"]
max_request_bytes = 2000000
batch_size = 11
timeout = "0s"
url = "https://example.com/"
queue_url = "https://sqs.us-east-1.amazonaws.com/1/q"
`, nil, `sinks[0].event_bus: invalid event bus name "orders bus": use 1 to 256 letters, digits, ".", "-", "_" and "/", or an ARN at config.toml:7
sinks[0].region: invalid region "US East": use a region code like "us-east-1" at config.toml:8
sinks[0].endpoint: must be an absolute http:// or https:// URL at config.toml:9
sinks[0].role_arn: must be an IAM role ARN like "arn:aws:iam::123456789012:role/changegate", got "changegate" at config.toml:10
sinks[0].source: must not start with "aws." (reserved for AWS services) at config.toml:11
sinks[0].detail_type: unknown placeholder {operationtype} (did you mean "operationType"?); allowed: {db}, {coll}, {operationType}, {source} at config.toml:12
sinks[0].resources[0]: must be an ARN (arn:...), got "bucket" at config.toml:13
sinks[0].max_request_bytes: must be between 1024 and 1048576, got 2000000 at config.toml:14
sinks[0].batch_size: must be between 1 and 10, got 11 at config.toml:15
sinks[0].timeout: must be at least 1ms, got 0s at config.toml:16
sinks[0].url: not an option of eventbridge sinks at config.toml:17
sinks[0].queue_url: not an option of eventbridge sinks at config.toml:18`},

		{"eventbridge bus missing, bad ARN, bad template", head + `
[[sinks]]
name = "bus"
type = "eventbridge"
detail_type = "{db"
[[sinks]]
name = "bus2"
type = "eventbridge"
event_bus = "arn:aws:sqs:us-east-1:123456789012:orders"
source = ""
`, nil, `sinks[0].event_bus: required key is missing at config.toml:4
sinks[0].detail_type: unterminated "{" (write "{{" for a literal brace) at config.toml:7
sinks[1].event_bus: an ARN must be an event bus ARN like "arn:aws:events:us-east-1:123456789012:event-bus/orders" at config.toml:11
sinks[1].source: must not be empty at config.toml:12`},

		{"sqs options", head + `
[[sinks]]
name = "q"
type = "sqs"
queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/audit.fifo"
queue_name = "audit.fifo"
max_request_bytes = 2000000
message_group_id = "fullDocument..customerId"
event_bus = "orders"
[[sinks]]
name = "q2"
type = "sqs"
queue_name = "audit queue"
[[sinks]]
name = "q3"
type = "sqs"
queue_name = "audit"
message_group_id = "fullDocument.customerId"
[[sinks]]
name = "q4"
type = "sqs"
`, nil, `sinks[0].queue_name: cannot be combined with queue_url (set one of them) at config.toml:8
sinks[0].max_request_bytes: must be between 1024 and 1048576, got 2000000 at config.toml:9
sinks[0].message_group_id: must be a dotted field path like "fullDocument.customerId", got "fullDocument..customerId" at config.toml:10
sinks[0].event_bus: not an option of sqs sinks at config.toml:11
sinks[1].queue_name: invalid queue name "audit queue": use 1 to 80 letters, digits, "-" and "_", ending in ".fifo" for a FIFO queue at config.toml:15
sinks[2].message_group_id: only applies to FIFO queues (a queue name ending in ".fifo") at config.toml:20
sinks[3].queue_url: required key is missing (or set queue_name) at config.toml:21`},

		{"syntax error", head + `
[[sources]]
name = "orders
`, nil, `invalid TOML: basic strings cannot have new lines at config.toml:5:15`},

		{"duplicate key", head + `
[server]
listen = ":1"
listen = ":2"
`, nil, `invalid TOML: key listen is already defined at config.toml:6:1`},

		{"table instead of array of tables", head + `
[sources]
name = "orders"
`, nil, `sources: expected an array of tables ([[sources]]), got table at config.toml:4`},

		{"retry policy", head + `
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
  [sinks.retry]
  max_attempts = 0
  jitter = 1.5
  multiplier = 0.5
  initial_interval = "2m"
  max_interval = "1m"
  max_elapsd = "1h"
`, nil, `sinks[0].retry.max_attempts: must be at least 1, got 0 at config.toml:9
sinks[0].retry.jitter: must be between 0 and 1, got 1.5 at config.toml:10
sinks[0].retry.multiplier: must be at least 1, got 0.5 at config.toml:11
sinks[0].retry.max_interval: must not be less than initial_interval (2m0s), got 1m0s at config.toml:13
sinks[0].retry.max_elapsd: unknown key (did you mean "max_elapsed"?) at config.toml:14`},

		{"webhook options", head + `
[[sinks]]
name = "hook"
type = "webhook"
url = "ftp://example.com/"
secret = "whsec_!!!"
secrets = ["a"]
bearer_token = "t"
basic_auth = { username = "u", pasword = "p" }
headers = { "Webhook-Id" = "x", "X Bad" = "y" }
batch_size = 5000
max_in_flight = 0
`, nil, `sinks[0].url: must be an absolute http:// or https:// URL at config.toml:7
sinks[0].secret: secret starting with "whsec_" must continue with standard base64 at config.toml:8
sinks[0].secrets: cannot be combined with secret (use secrets alone during a rotation) at config.toml:9
sinks[0].basic_auth: cannot be combined with bearer_token at config.toml:11
sinks[0].basic_auth.password: required key is missing at config.toml:11
sinks[0].basic_auth.pasword: unknown key (did you mean "password"?) at config.toml:11
sinks[0].headers.Webhook-Id: header Webhook-Id is set by changegate and cannot be overridden at config.toml:12
sinks[0].headers."X Bad": invalid header name "X Bad" at config.toml:12
sinks[0].batch_size: must be between 1 and 1000, got 5000 at config.toml:13
sinks[0].max_in_flight: must be at least 1, got 0 at config.toml:14`},

		{"rule operations and namespaces", head + `
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
[[sources]]
name = "shop"
database = "shop"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
[[rules]]
name = "a"
source = "orders"
operations = ["insert", "inserts", "insert"]
namespaces = ["shop.orders"]
sinks = ["hook", "hook"]
[[rules]]
name = "b"
source = "shop"
namespaces = ["shop", "other.things", "shop.*", "shop.a*"]
operations = []
sinks = []
`, nil, `rules[0].operations[1]: invalid value "inserts" (did you mean "insert"?); allowed values: "insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate", "snapshot" at config.toml:18
rules[0].operations[2]: operation "insert" is listed twice at config.toml:18
rules[0].namespaces: source "orders" watches the single collection shop.orders; namespaces apply only to database and cluster sources at config.toml:19
rules[0].sinks: sink "hook" is listed twice at config.toml:20
rules[1].namespaces[0]: invalid namespace "shop": want "db.coll" or "db.*" at config.toml:24
rules[1].namespaces[1]: namespace "other.things" is outside database "shop" watched by source "shop" at config.toml:24
rules[1].namespaces[3]: invalid namespace "shop.a*": want "db.coll" or "db.*" at config.toml:24
rules[1].operations: must not be empty (omit it to match every operation) at config.toml:25
rules[1].sinks: must list at least one sink at config.toml:26`},

		{"mongo and server values", `
[mongo]
uri = "localhost:27017"
state_database = "my.db"
checkpoint_collection = "x"
deadletter_collection = "x"
[server]
listen = "localhost"
`, nil, `mongo.uri: must start with "mongodb://" or "mongodb+srv://" at config.toml:2
mongo.state_database: invalid database name "my.db": it must not contain '.' at config.toml:3
mongo.deadletter_collection: must differ from checkpoint_collection at config.toml:5
server.listen: invalid address "localhost": want "host:port" or ":port" (or "" to disable the server) at config.toml:7`},

		{"max_in_flight_bytes below 1 MiB", `max_in_flight_bytes = 1048575
[mongo]
uri = "mongodb://localhost"
`, nil, `max_in_flight_bytes: must be at least 1048576 (1 MiB), got 1048575 at config.toml:1`},

		{"max_in_flight_bytes not an integer", `max_in_flight_bytes = "1GiB"
[mongo]
uri = "mongodb://localhost"
`, nil, `max_in_flight_bytes: expected an integer, got string at config.toml:1`},

		{"source values", head + `
[[sources]]
name = "my orders"
start_at = "yesterday"
batch_size = -1
max_in_flight_events = 0
[[sources]]
name = "b"
start_at = 2026-11-22T10:00:00
database = ""
`, nil, `sources[0].name: invalid name "my orders": use only letters, digits, "_", "." and "-" at config.toml:5
sources[0].start_at: invalid time "yesterday": want RFC 3339 with a time zone offset, e.g. "2026-11-22T10:00:00Z" at config.toml:6
sources[0].batch_size: must be at least 0, got -1 at config.toml:7
sources[0].max_in_flight_events: must be at least 1, got 0 at config.toml:8
sources[1].start_at: needs a time zone offset, e.g. 2026-11-22T10:00:00Z, got local datetime at config.toml:11
sources[1].database: must not be empty (omit it to watch the whole cluster) at config.toml:12`},

		{"filter values", head + `
[[sources]]
name = "orders"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
[[rules]]
name = "r"
source = "orders"
filter = { "clusterTime" = { "$gt" = 10:00:00 }, "x" = "${NOPE}" }
sinks = ["hook", 3]
[[rules]]
name = "s"
source = "orders"
filter = "{}"
sinks = ["hook"]
`, nil, `rules[0].filter.clusterTime."$gt": local times are not supported in filters; use a date-time at config.toml:13
rules[0].filter.x: environment variable NOPE is not set at config.toml:13
rules[0].sinks[1]: expected a string, got integer at config.toml:14
rules[1].filter: expected a table (an inline table in MongoDB query syntax), got string at config.toml:18`},

		{"unquoted dotted key in a filter", head + `
[[sources]]
name = "orders"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
[[rules]]
name = "r"
source = "orders"
filter = { fullDocument.status = "paid", "fullDocument.total" = { "$gt" = 1 } }
sinks = ["hook"]
`, nil, `rules[0].filter.fullDocument: an unquoted dotted key makes a nested document, which matches the whole field exactly; quote the field path instead: "fullDocument.status" = ... at config.toml:13`},

		{"many problems reported together, in line order", `
[mongo]
uri = "${MONGO_URI}"
[[sources]]
name = "orders"
colection = "orders"
[[sinks]]
name = "hook"
type = "webhook"
timeout = "soon"
[[rules]]
name = "r"
source = "orders"
sinks = ["hooks"]
`, nil, `mongo.uri: environment variable MONGO_URI is not set at config.toml:2
sources[0].colection: unknown key (did you mean "collection"?) at config.toml:5
sinks[0].url: required key is missing at config.toml:6
sinks[0].timeout: invalid duration "soon": use a number and a unit (ms, s, m, h), e.g. "10s" at config.toml:9
rules[0].sinks: unknown sink "hooks" (did you mean "hook"?) at config.toml:13`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWith("config.toml", src(tt.toml), tt.env)
			if err == nil {
				t.Fatalf("no error, want:\n%s", tt.want)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error does not wrap *Error")
			}
		})
	}
}
