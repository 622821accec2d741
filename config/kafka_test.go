package config

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestKafkaSink(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(filepath.Join(dir, "config.toml"), src(`
[mongo]
uri = "mongodb://localhost"
[[sinks]]
name = "plain"
type = "kafka"
brokers = ["kafka-1:9092", "kafka-2:9092"]
topic = "cdc.{db}.{coll}"
[[sinks]]
name = "secure"
type = "kafka"
brokers = ["${KAFKA_BROKER}"]
topic = "{source}"
batch_size = 500
max_request_bytes = 2000000
timeout = "30s"
oversize = "strip"
tls = true
tls_insecure_skip_verify = true
allow_cleartext_credentials = true
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "${KAFKA_USER}"
sasl_password = "file:pw"
`), envOf(map[string]string{"KAFKA_BROKER": "b-1.msk.example.com:9096", "KAFKA_USER": "cg"}))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		batch int
		k     KafkaSink
	}{
		{100, KafkaSink{Brokers: []string{"kafka-1:9092", "kafka-2:9092"}, Topic: "cdc.{db}.{coll}", MaxRequestBytes: 1000012, Timeout: 10 * time.Second}},
		{500, KafkaSink{Brokers: []string{"b-1.msk.example.com:9096"}, Topic: "{source}", MaxRequestBytes: 2000000, Timeout: 30 * time.Second,
			TLS: true, TLSInsecureSkipVerify: true, SASLMechanism: "SCRAM-SHA-512", SASLUsername: "cg", SASLPassword: "from-file"}},
	}
	for i, w := range want {
		s := cfg.Sinks[i]
		if s.BatchSize != w.batch || s.Kafka == nil || !reflect.DeepEqual(*s.Kafka, w.k) || s.SQS != nil {
			t.Errorf("%s: batch %d %+v\nwant %d %+v", s.Name, s.BatchSize, s.Kafka, w.batch, w.k)
		}
	}
}

func TestKafkaSinkErrors(t *testing.T) {
	tests := []struct {
		name string
		toml string
		want string
	}{
		{"missing keys", head + `
[[sinks]]
name = "k"
type = "kafka"
`, `sinks[0].brokers: required key is missing at config.toml:4
sinks[0].topic: required key is missing at config.toml:4`},

		{"bad values", head + `
[[sinks]]
name = "k"
type = "kafka"
brokers = ["kafka-1", "kafka-2:x"]
topic = "cdc.{operationType}"
max_request_bytes = 100
batch_size = 1001
sasl_mechanism = "scram-sha-256"
tls_ca_file = "/ca.pem"
queue_url = "https://sqs"
`, `sinks[0].brokers[0]: "kafka-1" is not host:port at config.toml:7
sinks[0].brokers[1]: "kafka-2:x": the port must be a number at config.toml:7
sinks[0].topic: unknown placeholder {operationType}; allowed: {db}, {coll}, {source} at config.toml:8
sinks[0].max_request_bytes: must be between 1024 and 1073741824, got 100 at config.toml:9
sinks[0].batch_size: must be between 1 and 1000, got 1001 at config.toml:10
sinks[0].sasl_mechanism: invalid value "scram-sha-256" (did you mean "SCRAM-SHA-256"?); allowed values: "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512" at config.toml:11
sinks[0].tls_ca_file: applies only with tls = true at config.toml:12
sinks[0].tls_ca_file: cannot read CA file: open /ca.pem: no such file or directory at config.toml:12
sinks[0].queue_url: not an option of kafka sinks at config.toml:13`},

		{"sasl without credentials, credentials without sasl", head + `
[[sinks]]
name = "a"
type = "kafka"
brokers = ["k:9092"]
topic = "t"
sasl_mechanism = "PLAIN"
sasl_username = "u"
[[sinks]]
name = "b"
type = "kafka"
brokers = ["k:9092"]
topic = "t"
sasl_password = "p"
tls_cert_file = "/c.pem"
tls = true
`, `sinks[0].sasl_password: required with sasl_mechanism = "PLAIN" at config.toml:9
sinks[0].sasl_mechanism: "PLAIN" sends the password in clear text without tls = true; set tls = true (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:9
sinks[1].sasl_password: applies only with sasl_mechanism at config.toml:16
sinks[1].tls_key_file: required with tls_cert_file at config.toml:17`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWith("config.toml", src(tt.toml), nil)
			if err == nil {
				t.Fatalf("no error, want:\n%s", tt.want)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}
