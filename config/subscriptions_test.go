package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// key32 is 32 bytes of base64: a valid subscriptions key.
const key32 = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

func TestSubscriptionsAndTokens(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "sub.key")
	if err := os.WriteFile(keyFile, []byte(key32+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(filepath.Join(dir, "config.toml"), src(`
[mongo]
uri = "mongodb://localhost"
[server]
admin_token = "admin-token-0123456789"
[[server.tokens]]
name = "team-a"
token = "${TEAM_A}"
prefix = "team-a-"
[[server.tokens]]
name = "team-b"
token = "team-b-token-0123456789"
prefix = "team-b-"
[[sinks]]
name = "ops"
type = "webhook"
url = "https://ops.example.com/"
[subscriptions]
enabled = true
key_file = "sub.key"
max_subscriptions = 50
allow_private_networks = true
events_sink = "ops"
delete_grace = "2h"
`), envOf(map[string]string{"TEAM_A": "team-a-token-0123456789"}))
	if err != nil {
		t.Fatal(err)
	}
	wantTokens := []Token{
		{Name: "team-a", Token: "team-a-token-0123456789", Prefix: "team-a-"},
		{Name: "team-b", Token: "team-b-token-0123456789", Prefix: "team-b-"},
	}
	if !reflect.DeepEqual(cfg.Server.Tokens, wantTokens) {
		t.Errorf("tokens = %#v, want %#v", cfg.Server.Tokens, wantTokens)
	}
	want := Subscriptions{Enabled: true, Key: "0123456789abcdef0123456789abcdef", KeySource: "key_file " + keyFile,
		KeyFile: keyFile, MaxSubscriptions: 50, AllowPrivateNetworks: true, EventsSink: "ops", DeleteGrace: 2 * time.Hour}
	if !reflect.DeepEqual(cfg.Subscriptions, want) {
		t.Errorf("subscriptions = %+v, want %+v", cfg.Subscriptions, want)
	}

	// The key from the environment, and the defaults.
	cfg, err = Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"
[subscriptions]
enabled = true
`), envOf(map[string]string{"CHANGEGATE_SECRET_KEY": " " + key32 + "\n"}))
	if err != nil {
		t.Fatal(err)
	}
	want = Subscriptions{Enabled: true, Key: "0123456789abcdef0123456789abcdef", KeySource: "CHANGEGATE_SECRET_KEY", MaxSubscriptions: 1000, DeleteGrace: DefaultDeleteGrace}
	if !reflect.DeepEqual(cfg.Subscriptions, want) {
		t.Errorf("subscriptions = %+v, want %+v", cfg.Subscriptions, want)
	}
	if s := cfg.Subscriptions.Key.String(); s != "[redacted]" {
		t.Errorf("key prints as %q", s)
	}
}

func TestSubscriptionsAndTokensErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("c2hvcnQ=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notB64 := filepath.Join(dir, "bad.key")
	if err := os.WriteFile(notB64, []byte("not base64 at all!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		toml string
		env  map[string]string
		want string
	}{
		// head is lines 1-2 and line 3 is empty: a case's own lines start at 4.
		{"tokens", head + `
[server]
admin_token = "admin-token-0123456789"
[[server.tokens]]
name = "a"
token = "short"
prefix = "team-a-"
[[server.tokens]]
name = "a"
token = "admin-token-0123456789"
prefix = "team a"
[[server.tokens]]
name = "c"
token = "same-token-0123456789"
[[server.tokens]]
name = "d"
token = "same-token-0123456789"
prefix = "d-"
scope = "all"
`, nil, `server.tokens[0].token: is 5 characters, want at least 16 (e.g. the output of openssl rand -hex 16) at config.toml:8
server.tokens[1].name: duplicate token name "a" (first defined at line 7) at config.toml:11
server.tokens[1].token: is the same as server.admin_token: a scoped token must differ from it at config.toml:12
server.tokens[1].prefix: invalid prefix "team a": use only letters, digits, "_", "." and "-" (at least one), as in subscription names at config.toml:13
server.tokens[2].prefix: required key is missing at config.toml:14
server.tokens[3].token: is the same token as the one at line 16: each token must be different at config.toml:19
server.tokens[3].scope: unknown key at config.toml:21`},

		{"key file problems and unknown events sink", head + `
[subscriptions]
key_file = "` + short + `"
events_sink = "opz"
max_subscriptions = 0
[[sinks]]
name = "ops"
type = "webhook"
url = "https://ops.example.com/"
`, nil, `subscriptions.key_file: ` + short + `: the key is 5 bytes, want exactly 32 (make one with: openssl rand -base64 32) at config.toml:5
subscriptions.events_sink: unknown sink "opz" (did you mean "ops"?) at config.toml:6
subscriptions.max_subscriptions: must be between 1 and 100000, got 0 at config.toml:7`},

		{"key file not base64, token without name", head + `
[subscriptions]
key_file = "` + notB64 + `"
[[server.tokens]]
token = "x"
`, nil, `subscriptions.key_file: ` + notB64 + `: the key is not standard base64 (make one with: openssl rand -base64 32) at config.toml:5
server.tokens[0].name: required key is missing at config.toml:6
server.tokens[0].prefix: required key is missing at config.toml:6
server.tokens[0].token: is 1 characters, want at least 16 (e.g. the output of openssl rand -hex 16) at config.toml:7`},

		{"key twice", head + `
[subscriptions]
key_file = "` + short + `"
`, map[string]string{"CHANGEGATE_SECRET_KEY": key32}, `subscriptions.key_file: CHANGEGATE_SECRET_KEY is set too: give the key one way only at config.toml:5`},

		{"bad key in the environment", head + `
[subscriptions]
enabled = true
`, map[string]string{"CHANGEGATE_SECRET_KEY": "c2hvcnQ="}, `subscriptions: environment variable CHANGEGATE_SECRET_KEY: the key is 5 bytes, want exactly 32 (make one with: openssl rand -base64 32) at config.toml:4`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("config.toml", src(tc.toml), envOf(tc.env))
			if err == nil {
				t.Fatal("no error")
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
			for _, secret := range []string{"same-token-0123456789", "admin-token-0123456789", key32} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the error shows a secret: %s", err)
				}
			}
		})
	}
}
