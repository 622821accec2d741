package config

import "testing"

// Credentials that would cross the network in clear text, or go to a server
// whose certificate is not verified, are refused with the key and line,
// unless the sink sets allow_cleartext_credentials = true; https, and
// Kafka's SASL over TLS, are accepted without it.
func TestCleartextCredentials(t *testing.T) {
	const webhook = head + `[[sinks]]
name = "hook"
type = "webhook"
`
	const kafka = head + `[[sinks]]
name = "k"
type = "kafka"
brokers = ["kafka-1:9092"]
topic = "t"
`
	tests := []struct {
		name, toml, want string
	}{
		{"basic_auth over http", webhook + `url = "http://hooks.internal/x"
basic_auth = { username = "u", password = "p" }
`, "sinks[0].basic_auth: the password is sent in clear text to an http:// URL; use an https:// URL (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:7"},
		{"bearer_token and Authorization over http", webhook + `url = "http://hooks.internal/x"
bearer_token = "t"
[[sinks]]
name = "h2"
type = "webhook"
url = "http://hooks.internal/y"
headers = { "X-Team" = "a", authorization = "Token x" }
`, `sinks[0].bearer_token: the token is sent in clear text to an http:// URL; use an https:// URL (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:7
sinks[1].headers.authorization: the credentials are sent in clear text to an http:// URL; use an https:// URL (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:12`},
		{"tls_insecure_skip_verify", webhook + `url = "https://hooks.internal/x"
tls_insecure_skip_verify = true
`, "sinks[0].tls_insecure_skip_verify: the server's certificate is not verified: anyone on the network path can pose as the server and read what is sent, credentials included (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:7"},
		{"webhook allowed", webhook + `url = "http://hooks.internal/x"
basic_auth = { username = "u", password = "p" }
tls_insecure_skip_verify = true
allow_cleartext_credentials = true
`, ""},
		{"webhook https", webhook + `url = "https://hooks.internal/x"
basic_auth = { username = "u", password = "p" }
`, ""},
		{"webhook http without credentials", webhook + `url = "http://hooks.internal/x"
headers = { "X-Team" = "a" }
`, ""},
		{"kafka PLAIN without tls", kafka + `sasl_mechanism = "PLAIN"
sasl_username = "u"
sasl_password = "p"
`, `sinks[0].sasl_mechanism: "PLAIN" sends the password in clear text without tls = true; set tls = true (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:8`},
		{"kafka SCRAM without tls, insecure tls", kafka + `sasl_mechanism = "SCRAM-SHA-256"
sasl_username = "u"
sasl_password = "p"
[[sinks]]
name = "k2"
type = "kafka"
brokers = ["kafka-1:9092"]
topic = "t"
tls = true
tls_insecure_skip_verify = true
`, `sinks[0].sasl_mechanism: "SCRAM-SHA-256" without tls = true sends the user name and the exchange unencrypted (an eavesdropper can guess the password offline), and every record; set tls = true (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:8
sinks[1].tls_insecure_skip_verify: the server's certificate is not verified: anyone on the network path can pose as the server and read what is sent, credentials included (or set allow_cleartext_credentials = true on the sink to accept the risk) at config.toml:17`},
		{"kafka SASL over tls", kafka + `tls = true
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "u"
sasl_password = "p"
`, ""},
		{"kafka allowed", kafka + `sasl_mechanism = "PLAIN"
sasl_username = "u"
sasl_password = "p"
allow_cleartext_credentials = true
`, ""},
		{"not a key of sqs", head + `[[sinks]]
name = "q"
type = "sqs"
queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/q"
allow_cleartext_credentials = true
`, "sinks[0].allow_cleartext_credentials: not an option of sqs sinks at config.toml:7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWith("config.toml", src(tt.toml), nil)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Fatalf("got:\n%v\nwant:\n%s", err, tt.want)
			}
		})
	}
}
