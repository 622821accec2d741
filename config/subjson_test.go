package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// subCfg is the configuration subscriptions are checked against: a source
// "orders" and a TOML sink and rule.
func subCfg(t *testing.T) *Config {
	t.Helper()
	cfg, err := Parse("config.toml", src(`
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
	return cfg
}

func TestParseSubscriptionJSON(t *testing.T) {
	cfg := subCfg(t)
	cfg.Subscriptions.AllowPrivateNetworks = true
	route, problems := ParseSubscriptionJSON([]byte(`{
	  "name": "team-a-paid",
	  "source": "orders",
	  "operations": ["insert", "update"],
	  "filter": {"documentKey._id": {"$oid": "5f0c8a1e2b3c4d5e6f708192"}, "fullDocument.total": {"$gte": 100}, "fullDocument.note": "${HOME}"},
	  "fields": {"fullDocument.total": 1, "fullDocument.status": 1},
	  "redact": ["fullDocument.customer.email"],
	  "envelope": "document",
	  "sink": {"type": "webhook", "url": "https://a.example.com/hook?x=${HOME}", "headers": {"X-Team": "file:/etc/passwd"},
	           "batch_size": 10, "transactions": "group", "max_in_flight": 4},
	  "backfill": true
	}`), cfg)
	if problems != nil {
		t.Fatalf("problems: %v", problems)
	}
	if !route.Backfill {
		t.Error("backfill not set")
	}
	r, s := route.Rule, route.Sink
	oid, _ := bson.ObjectIDFromHex("5f0c8a1e2b3c4d5e6f708192")
	wantFilter := bson.D{
		{Key: "documentKey._id", Value: oid},
		{Key: "fullDocument.total", Value: bson.D{{Key: "$gte", Value: int64(100)}}},
		{Key: "fullDocument.note", Value: "${HOME}"}, // literal: no expansion
	}
	if !reflect.DeepEqual(r.Filter, wantFilter) {
		t.Errorf("filter = %#v, want %#v", r.Filter, wantFilter)
	}
	if r.Name != "team-a-paid" || r.Source != "orders" || !reflect.DeepEqual(r.Sinks, []string{"team-a-paid"}) ||
		!reflect.DeepEqual(r.Operations, []string{"insert", "update"}) || r.Shape.Envelope != EnvelopeDocument ||
		len(r.Shape.Fields) != 2 || !reflect.DeepEqual(r.Shape.Redact, []string{"fullDocument.customer.email"}) {
		t.Errorf("rule = %+v", r)
	}
	if s.Name != "team-a-paid" || s.Type != SinkWebhook || s.BatchSize != 10 || s.Transactions != TransactionsGroup || s.MaxInFlight != 4 {
		t.Errorf("sink = %+v", s)
	}
	w := s.Webhook
	if w.URL != "https://a.example.com/hook?x=${HOME}" || !w.AllowPrivateNetworks || len(w.Secrets) != 0 ||
		!reflect.DeepEqual(w.Headers, []Header{{Name: "X-Team", Value: "file:/etc/passwd"}}) { // literal: no file read
		t.Errorf("webhook = %+v", w)
	}

	// The defaults of a minimal subscription are a TOML sink's.
	route, problems = ParseSubscriptionJSON([]byte(`{"name":"b","source":"orders","sink":{"type":"webhook","url":"https://b.example.com/"}}`), subCfg(t))
	if problems != nil {
		t.Fatal(problems)
	}
	if s := route.Sink; s.BatchSize != 1 || s.MaxInFlight != 0 || s.MaxInFlightMin != 1 || s.Retry.MaxAttempts != DefaultRetryMaxAttempts ||
		s.ParkAfter != DefaultParkAfter || s.Webhook.AllowPrivateNetworks || s.Webhook.Timeout != DefaultWebhookTimeout {
		t.Errorf("sink = %+v", s)
	}
	if r := route.Rule; r.Operations != nil || r.Filter != nil || r.Shape.Envelope != EnvelopeFull {
		t.Errorf("rule = %+v", r)
	}
}

func TestParseSubscriptionJSONProblems(t *testing.T) {
	cfg := subCfg(t)
	const sink = `"sink":{"type":"webhook","url":"https://a.example.com/"}`
	tests := []struct {
		name, body string
		want       string // one problem a line
	}{
		{"not JSON", `{"name": `, `$: invalid JSON: unexpected end of the document`},
		{"disable_after too short", `{"name":"a","source":"orders","disable_after":"10ms",` + sink + `}`, `$.disable_after: must be at least 1s, got 10ms`},
		{"disable_after not a duration", `{"name":"a","source":"orders","disable_after":72,` + sink + `}`, `$.disable_after: expected a duration string like "10s", got integer`},
		{"not an object", `["a"]`, `$: expected a JSON object`},
		{"trailing data", `{"name":"a","source":"orders",` + sink + `} {}`, `$: unexpected data after the JSON object`},
		{"too large", `{"name":"` + strings.Repeat("a", MaxSubscriptionJSONBytes) + `"}`, `$: the document is 65547 bytes, at most 65536 are accepted`},
		{"too deep", `{"name":"a","x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, `$: nested more than 32 levels deep`},
		{"filter too deep", `{"filter":` + strings.Repeat(`{"$and":[`, 20) + `{}` + strings.Repeat(`]}`, 20) + `}`, `$: nested more than 32 levels deep`},

		{"unknown, duplicate and null fields; missing ones", `{"name":"a","nmae":"b","name":"c","operations":null,"sink":{"type":"webhook","url":"https://a.example.com/","secret":"whsec_x","allow_private_networks":true}}`,
			`$.name: duplicate field
$.operations: null is not accepted: leave the field out
$.nmae: unknown field
$.sink.secret: unknown field
$.sink.allow_private_networks: unknown field
$.source: required field is missing`},

		{"bad values", `{"name":"a b","source":"order","operations":["insert","upsert"],"envelope":"all","redact":["customer.email"],
		  "fields":{"fullDocument.a":1,"fullDocument.b":0},"sink":{"type":"webhook","url":"ftp://x","batch_size":5000,"max_in_flight":"many",
		  "transactions":"yes","headers":{"Webhook-Id":"x","X-A":"a\nb"}},"backfill":"yes"}`,
			`$.backfill: expected a boolean (true or false), got string
$.name: invalid name "a b": use only letters, digits, "_", "." and "-"
$.sink.max_in_flight: must be "auto" or a number (without quotes), got "many"
$.sink.batch_size: must be between 1 and 1000, got 5000
$.sink.transactions: invalid value "yes"; allowed values: "none", "group"
$.sink.url: must be an absolute http:// or https:// URL
$.sink.headers['Webhook-Id']: header Webhook-Id is set by changegate and cannot be overridden
$.sink.headers['X-A']: header value must not contain line breaks
$.source: unknown source "order" (did you mean "orders"?)
$.operations[1]: invalid value "upsert" (did you mean "insert"?); allowed values: "insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate", "snapshot"
$.fields['fullDocument.b']: fields mixes inclusion and exclusion ("fullDocument.a" = 1, "fullDocument.b" = 0): use one or the other (only "fullDocument._id" = 0 may be added to an inclusion)
$.redact[0]: path "customer.email" must start with "fullDocument." and name a field of the document (it applies to fullDocument, fullDocumentBeforeChange and updateDescription alike)
$.envelope: invalid value "all"; allowed values: "full", "document", "key"`},

		{"sink not an object, name too long", `{"name":"` + strings.Repeat("n", 101) + `","source":"orders","sink":"https://a.example.com/"}`,
			`$.name: is 101 characters, at most 100
$.sink: expected an object, got a string`},

		{"missing sink", `{"name":"a","source":"orders"}`, `$.sink: required field is missing (an object with "type": "webhook" and "url")`},

		{"bad filter", `{"name":"a","source":"orders",` + sink + `,"filter":{"fullDocument.total":{"$gtx":1}}}`,
			`$.filter: invalid filter: unknown operator $gtx at fullDocument.total`},
		{"another sink type", `{"name":"a","source":"orders","sink":{"type":"sqs","url":"https://a.example.com/"}}`,
			`$.sink.type: invalid value "sqs"; allowed values: "webhook"`},
		{"filter not Extended JSON", `{"name":"a","source":"orders",` + sink + `,"filter":{"x":{"$oid":"nope"}}}`,
			`$.filter: expected an object in MongoDB query syntax (Extended JSON): `},
		{"backtracking filter", `{"name":"a","source":"orders",` + sink + `,"filter":{"fullDocument.s":{"$regex":"^(a+)+$"}}}`,
			`$.filter: refused: `},
		{"header problems", `{"name":"a","source":"orders","sink":{"type":"webhook","url":"https://a.example.com/","headers":{"Bad Name":"x","Host":"y"}}}`,
			`$.sink.headers['Bad Name']: invalid header name "Bad Name"
$.sink.headers.Host: header Host is set by changegate and cannot be overridden`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			route, problems := ParseSubscriptionJSON([]byte(tc.body), cfg)
			if route != nil || problems == nil {
				t.Fatalf("accepted: %+v", route)
			}
			var lines []string
			for _, p := range problems {
				lines = append(lines, p.String())
			}
			got := strings.Join(lines, "\n")
			if strings.HasSuffix(tc.want, ": ") {
				if !strings.HasPrefix(got, tc.want) || len(problems) != 1 {
					t.Errorf("got\n%s\nwant one problem starting with\n%s", got, tc.want)
				}
				return
			}
			if got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestJSONPath(t *testing.T) {
	for key, want := range map[string]string{
		"":                                "$",
		"name":                            "$.name",
		"redact[1]":                       "$.redact[1]",
		`sink.headers."X-Api-Key"`:        "$.sink.headers['X-Api-Key']",
		`filter."fullDocument.total".$gt`: "$.filter['fullDocument.total']['$gt']",
		`filter."it's"`:                   `$.filter['it\'s']`,
		`fields."a\\b"[0]`:                `$.fields['a\\b'][0]`,
	} {
		if got := jsonPath(key); got != want {
			t.Errorf("jsonPath(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestParseSubscriptionDisableAfter: disable_after is read (off when left
// out).
func TestParseSubscriptionDisableAfter(t *testing.T) {
	cfg := subCfg(t)
	for body, want := range map[string]time.Duration{
		`{"name":"a","source":"orders","disable_after":"72h","sink":{"type":"webhook","url":"https://a.example.com/"}}`: 72 * time.Hour,
		`{"name":"a","source":"orders","sink":{"type":"webhook","url":"https://a.example.com/"}}`:                       0,
	} {
		route, problems := ParseSubscriptionJSON([]byte(body), cfg)
		if problems != nil || route.DisableAfter != want {
			t.Errorf("%s: %v %v, want %v", body, route, problems, want)
		}
	}
}
