package subscription_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/subscription"
)

func validatorConfig(t *testing.T, allowPrivate bool) *config.Config {
	t.Helper()
	cfg, err := config.Parse("config.toml", []byte(`
[mongo]
uri = "mongodb://localhost"
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
[[sinks]]
name = "billing"
type = "webhook"
url = "https://billing.example.com/"
[[rules]]
name = "paid"
source = "orders"
sinks = ["billing"]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Subscriptions.AllowPrivateNetworks = allowPrivate
	return cfg
}

func TestValidate(t *testing.T) {
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "intranet.example.com" {
			return []netip.Addr{netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("10.1.2.3")}, nil
		}
		return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
	}
	v := &subscription.Validator{Config: validatorConfig(t, false), Resolve: resolve}
	body := func(name, url string) []byte {
		return []byte(`{"name": "` + name + `", "source": "orders",
		  "sink": {"type": "webhook", "url": "` + url + `"}}`)
	}
	route, compact, problems := v.Validate(context.Background(), body("team-a-x", "https://hooks.example.com/t/SECRET"))
	if problems != nil || route == nil || route.Sink.Name != "team-a-x" {
		t.Fatalf("valid subscription: %v", problems)
	}
	if string(compact) != `{"name":"team-a-x","source":"orders","sink":{"type":"webhook","url":"https://hooks.example.com/t/SECRET"}}` {
		t.Errorf("compact form %s", compact)
	}
	for _, tc := range []struct{ name, url, want string }{
		{"billing", "https://a.example.com/", `$.name: "billing" is the name of a sink or rule of the configuration file: choose another`},
		{"paid", "https://a.example.com/", `$.name: "paid" is the name of a sink or rule of the configuration file: choose another`},
		{"a", "http://127.0.0.1:8080/SECRET", `$.sink.url: refused: 127.0.0.1 is a loopback address; private, loopback and link-local targets need [subscriptions] allow_private_networks in the operator's configuration`},
		{"a", "http://[::1]/", `$.sink.url: refused: ::1 is a loopback address; `},
		{"a", "http://169.254.169.254/latest/meta-data", `$.sink.url: refused: 169.254.169.254 is a cloud metadata address; `},
		{"a", "http://192.168.1.10/", `$.sink.url: refused: 192.168.1.10 is a private address; `},
		{"a", "http://[fe80::1]/", `$.sink.url: refused: fe80::1 is a link-local address; `},
		{"a", "http://LOCALHOST./", `$.sink.url: refused: localhost is a loopback address; `},
		{"a", "http://api.localhost/", `$.sink.url: refused: api.localhost is a loopback address; `},
		{"a", "https://intranet.example.com/", `$.sink.url: refused: intranet.example.com (10.1.2.3) is a private address; `},
	} {
		_, _, problems := v.Validate(context.Background(), body(tc.name, tc.url))
		if len(problems) != 1 || !strings.HasPrefix(problems[0].String(), tc.want) {
			t.Errorf("%s %s: %v, want %s", tc.name, tc.url, problems, tc.want)
		}
		if len(problems) == 1 && strings.Contains(problems[0].Message, "SECRET") {
			t.Errorf("the problem shows the URL's path: %s", problems[0])
		}
	}
	// Only the operator's configuration allows private targets.
	v = &subscription.Validator{Config: validatorConfig(t, true)}
	route, _, problems = v.Validate(context.Background(), body("a", "http://127.0.0.1:8080/"))
	if problems != nil || !route.Sink.Webhook.AllowPrivateNetworks {
		t.Errorf("with allow_private_networks: %v", problems)
	}
	// Problems of the decoder come through with their paths.
	_, _, problems = v.Validate(context.Background(), []byte(`{"name":"a","source":"orders","sink":{"type":"webhook","url":"https://a.example.com/","batch_size":0}}`))
	if out, _ := json.Marshal(problems); string(out) != `[{"path":"$.sink.batch_size","message":"must be between 1 and 1000, got 0"}]` {
		t.Errorf("problems as JSON: %s", out)
	}
}

func TestSubscriptionJSONHidesSecretsAndHeaders(t *testing.T) {
	f := newFixture(t, true)
	sub, secret, err := f.store.Create(f.ctx, "admin", "a", json.RawMessage(
		`{"name":"a","source":"orders","filter":{"fullDocument.n":{"$gt":9007199254740993}},"sink":{"type":"webhook","url":"https://a.example.com/","headers":{"Authorization":"Bearer TOKEN123"}}}`), 10)
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(sub)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{`"status":"active"`, `"revision":1`, `"headers":{"Authorization":"[redacted]"}`, `"$gt":9007199254740993`, `"signing_secrets":[{"created_at":"2026-11-28T10:00:00Z"}]`, `"created_cluster_time":{"i":`} {
		if !strings.Contains(s, want) {
			t.Errorf("%s lacks %s", s, want)
		}
	}
	if strings.Contains(s, "TOKEN123") || strings.Contains(s, strings.TrimPrefix(secret.Value(), "whsec_")) {
		t.Errorf("the JSON shows a secret: %s", s)
	}
}
