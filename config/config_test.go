package config

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// envOf returns a lookupEnv function backed by m.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// src trims the leading newline of a raw string literal so that line 1 is
// the line after the opening backquote.
func src(s string) []byte { return []byte(strings.TrimPrefix(s, "\n")) }

func TestExampleConfig(t *testing.T) {
	data, err := os.ReadFile("../config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"MONGODB_URI":            "mongodb://mongo:27017/?replicaSet=rs0",
		"BILLING_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"WAREHOUSE_PASSWORD":     "hunter2",
	}
	cfg, err := Parse("config.example.toml", data, envOf(env))
	if err != nil {
		t.Fatalf("config.example.toml does not parse:\n%v", err)
	}
	if len(cfg.Sources) != 2 || len(cfg.Sinks) != 4 || len(cfg.Rules) != 2 {
		t.Fatalf("got %d sources, %d sinks, %d rules; want 2, 4, 2", len(cfg.Sources), len(cfg.Sinks), len(cfg.Rules))
	}
	if got := cfg.Mongo.URI.Value(); got != env["MONGODB_URI"] {
		t.Errorf("mongo.uri = %q", got)
	}
	billing := cfg.Sink("billing")
	if billing == nil || billing.Webhook == nil || len(billing.Webhook.Secrets) != 1 ||
		billing.Webhook.Secrets[0].Value() != env["BILLING_WEBHOOK_SECRET"] {
		t.Errorf("billing sink secrets not expanded: %+v", billing)
	}
	if r := cfg.Rules[0]; r.Filter == nil || r.Filter[0].Key != "fullDocument.status" {
		t.Errorf("paid-orders filter = %v", r.Filter)
	}
	if p := cfg.Source("orders").Pipeline; len(p) != 1 || p[0][0].Key != "$match" {
		t.Errorf("orders pipeline = %v", p)
	}
	// Every option of the schema appears in the example, set or commented.
	text := string(data)
	for _, key := range allKeys() {
		if !strings.Contains(text, "\n"+key+" =") && !strings.Contains(text, "# "+key+" =") && !strings.Contains(text, "  "+key+" =") {
			t.Errorf("config.example.toml does not document %q", key)
		}
	}
}

// allKeys lists every key the schema accepts (sub-table keys included).
func allKeys() []string {
	keys := []string{
		"uri", "state_database", "checkpoint_collection", "deadletter_collection",
		"listen", "shutdown_grace", "admin_token", "public_read", "allowed_hosts", "console", "console_auth",
		"enabled", "lease_ttl", "renew_every", "instance", "leases_collection", "partitions",
		"mode", "retention", "collection",
		"name", "database", "collection", "full_document", "full_document_before_change", "pipeline",
		"start_at", "on_history_lost", "split_large_events", "on_oversize_event", "batch_size", "max_await", "max_in_flight_events", "checkpoint_interval", "snapshot",
		"type", "max_in_flight", "max_in_flight_min", "max_in_flight_max", "rate_limit", "rate_limit_burst", "circuit_max_cooldown", "ordering", "batch_wait", "json", "park_after", "oversize", "trace_context", "transactions",
		"max_attempts", "initial_interval", "max_interval", "max_elapsed", "multiplier", "jitter",
		"source", "operations", "namespaces", "filter", "sinks",
	}
	d := &decoder{sinkTypes: builtinSinkTypes()}
	for _, ks := range d.sinkTypeKeys() {
		keys = append(keys, ks...)
	}
	return keys
}

func TestDefaults(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"

[[sources]]
name = "orders"

[[sinks]]
name = "hook"
type = "webhook"
url = "http://localhost:8080/"

[[rules]]
name = "all"
source = "orders"
sinks = ["hook"]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		File: "config.toml",
		Mongo: Mongo{
			URI:                  "mongodb://localhost",
			StateDatabase:        "changegate",
			CheckpointCollection: "checkpoints",
			DeadLetterCollection: "deadletters",
		},
		Server: Server{Listen: ":9464", ShutdownGrace: 30 * time.Second, ReadyMaxLag: 30 * time.Second, Console: true, ConsoleAuth: ConsoleAuthToken},
		Cluster: Cluster{
			LeaseTTL:         15 * time.Second,
			RenewEvery:       5 * time.Second,
			Instance:         cfg.Cluster.Instance, // random, checked below
			LeasesCollection: "leases",
		},
		DeliveryLog: DeliveryLog{Mode: "failures", Retention: 72 * time.Hour, Collection: "deliveries"},
		Sources: []Source{{
			Name:                     "orders",
			FullDocument:             "default",
			FullDocumentBeforeChange: "off",
			OnHistoryLost:            HistoryLostFail,
			SplitLargeEvents:         SplitLargeEventsAuto,
			OnOversizeEvent:          OversizeEventFail,
			MaxAwait:                 time.Second,
			MaxInFlightEvents:        10000,
			CheckpointInterval:       time.Second,
			Partitions:               1,
			Snapshot:                 "never",
		}},
		Sinks: []Sink{{
			Name:           "hook",
			Type:           "webhook",
			MaxInFlightMin: 1,
			MaxInFlightMax: 0, CircuitMaxCooldown: 10 * time.Second,
			Ordering:     OrderingKey,
			BatchSize:    1,
			JSON:         JSONRelaxed,
			ParkAfter:    30 * time.Second,
			TraceContext: true,
			Oversize:     OversizeDeadLetter,
			Transactions: TransactionsNone,
			Retry: Retry{
				MaxAttempts:     8,
				InitialInterval: 500 * time.Millisecond,
				MaxInterval:     time.Minute,
				MaxElapsed:      15 * time.Minute,
				Multiplier:      2,
				Jitter:          0.2,
			},
			Webhook: &WebhookSink{URL: "http://localhost:8080/", Timeout: 10 * time.Second, MaxRequestBytes: 1 << 20},
			Shape:   defaultShape,
		}},
		Rules:         []Rule{{Name: "all", Source: "orders", Sinks: []string{"hook"}, Shape: defaultShape}},
		Subscriptions: Subscriptions{MaxSubscriptions: 1000, DeleteGrace: DefaultDeleteGrace},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got\n%#v\nwant\n%#v", cfg, want)
	}
	if got := cfg.Sources[0].Level(); got != "cluster" {
		t.Errorf("Level() = %q, want cluster", got)
	}
	if !regexp.MustCompile(`^changegate-[0-9a-f]{12}$`).MatchString(cfg.Cluster.Instance) {
		t.Errorf("default instance without $HOSTNAME = %q, want a random id", cfg.Cluster.Instance)
	}
}

func TestCluster(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"

[cluster]
enabled = true
lease_ttl = "9s"

[[sources]]
name = "orders"
partitions = 4
`), envOf(map[string]string{"HOSTNAME": "changegate-7d9f-x2"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Cluster{Enabled: true, LeaseTTL: 9 * time.Second, RenewEvery: 3 * time.Second, Instance: "changegate-7d9f-x2", LeasesCollection: "leases"}
	if cfg.Cluster != want {
		t.Errorf("cluster = %+v, want %+v", cfg.Cluster, want)
	}
	if cfg.Sources[0].Partitions != 4 {
		t.Errorf("partitions = %d, want 4", cfg.Sources[0].Partitions)
	}
	cfg, err = Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"

[cluster]
enabled = true
lease_ttl = "3s"
renew_every = "1400ms"
instance = "a"
leases_collection = "owners"
`), envOf(map[string]string{"HOSTNAME": "h"}))
	if err != nil {
		t.Fatal(err)
	}
	want = Cluster{Enabled: true, LeaseTTL: 3 * time.Second, RenewEvery: 1400 * time.Millisecond, Instance: "a", LeasesCollection: "owners"}
	if cfg.Cluster != want {
		t.Errorf("cluster = %+v, want %+v", cfg.Cluster, want)
	}
}

func TestDeliveryLog(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"

[delivery_log]
mode = "all"
retention = "168h"
collection = "attempts"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := DeliveryLog{Mode: DeliveryLogAll, Retention: 168 * time.Hour, Collection: "attempts"}
	if cfg.DeliveryLog != want {
		t.Errorf("delivery_log = %+v, want %+v", cfg.DeliveryLog, want)
	}
	cfg, err = Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"

[delivery_log]
mode = "off"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want = DeliveryLog{Mode: DeliveryLogOff, Retention: 72 * time.Hour, Collection: "deliveries"}
	if cfg.DeliveryLog != want {
		t.Errorf("delivery_log = %+v, want %+v", cfg.DeliveryLog, want)
	}
}

func TestExpansionAndSecrets(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cr3t-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pw.txt"), []byte("pa55\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "url.txt"), []byte("https://hooks.example.com/services/T1/B2/secretpath\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.txt"), []byte("raw-key-0123456789abcdefghij\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"MONGO_HOST": "db.internal",
		"MONGO_PW":   "mongopw",
		"EMPTY":      "",
		"HOOK_KEY":   "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	}
	cfgFile := filepath.Join(dir, "config.toml")
	cfg, err := Parse(cfgFile, src(`
[mongo]
uri = "mongodb://app:${MONGO_PW}@${MONGO_HOST}:${MONGO_PORT:-27017}/?replicaSet=rs0"
state_database = "${STATE_DB:-cg}"
[server]
admin_token = "file:`+tokenFile+`"
listen = "${EMPTY:-127.0.0.1:9000}"

[[sinks]]
name = "a"
type = "webhook"
url = "https://example.com/$${literal}"
secrets = ["${HOOK_KEY}", "file:key.txt"]
headers = { "x-api-key" = "${MONGO_PW}", "X-Team" = "billing" }
basic_auth = { username = "u", password = "file:pw.txt" }

[[sinks]]
name = "b"
type = "webhook"
url = "file:url.txt"
`), envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct{ name, got, want string }{
		{"mongo.uri", cfg.Mongo.URI.Value(), "mongodb://app:mongopw@db.internal:27017/?replicaSet=rs0"},
		{"mongo.state_database", cfg.Mongo.StateDatabase, "cg"},
		{"server.admin_token", cfg.Server.AdminToken.Value(), "s3cr3t-token-0123456789"},
		{"server.listen", cfg.Server.Listen, "127.0.0.1:9000"},
		{"url", cfg.Sinks[0].Webhook.URL, "https://example.com/${literal}"},
		{"secrets[0]", cfg.Sinks[0].Webhook.Secrets[0].Value(), env["HOOK_KEY"]},
		{"secrets[1]", cfg.Sinks[0].Webhook.Secrets[1].Value(), "raw-key-0123456789abcdefghij"},
		{"headers[0].name", cfg.Sinks[0].Webhook.Headers[0].Name, "X-Api-Key"},
		{"headers[0].value", cfg.Sinks[0].Webhook.Headers[0].Value.Value(), "mongopw"},
		{"headers[1].name", cfg.Sinks[0].Webhook.Headers[1].Name, "X-Team"},
		{"basic_auth.password", cfg.Sinks[0].Webhook.BasicAuth.Password.Value(), "pa55"},
		{"sinks[1].url (file:)", cfg.Sinks[1].Webhook.URL, "https://hooks.example.com/services/T1/B2/secretpath"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}

	// No secret shows up when the configuration is printed or logged.
	var out bytes.Buffer
	fmt.Fprintf(&out, "%v %+v %#v %s %q %x\n", cfg, *cfg, cfg.Sinks[0].Webhook, cfg.Mongo.URI, cfg.Mongo.URI, cfg.Mongo.URI)
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out.Write(js)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("config", "uri", cfg.Mongo.URI, "sink", cfg.Sinks[0].Webhook)
	slog.New(slog.NewTextHandler(&out, nil)).Info("config", "token", cfg.Server.AdminToken)
	for _, secret := range []string{"mongopw", "s3cr3t-token", "raw-key-0123456789", "pa55", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("secret %q printed:\n%s", secret, out.String())
		}
	}
	if !strings.Contains(out.String(), "[redacted]") {
		t.Errorf("no [redacted] in output:\n%s", out.String())
	}
	if got := fmt.Sprint(Secret("")); got != "" {
		t.Errorf("empty secret prints %q", got)
	}
}

func TestFilterAndPipeline(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"
[[sources]]
name = "shop"
database = "shop"
start_at = 2026-11-22T10:00:00+01:00
pipeline = '''
[
  {"$match": {"ns.coll": {"$ne": "tmp"}}},
  {"$set": {"at": {"$date": "2026-01-01T00:00:00Z"}, "n": {"$numberLong": "7"}}}
]
'''
[[sources]]
name = "cluster"
start_at = "2026-11-22T10:00:00.5Z"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/"
[[rules]]
name = "r"
source = "shop"
operations = ["update", "insert"]
namespaces = ["shop.orders", "shop.*"]
filter = { "fullDocument.z" = "paid", "fullDocument.a" = { "$gte" = 100, "$lt" = 1.5e3 }, "$or" = [ { "b" = true }, { "c" = { "$in" = [1, "x"] } } ], "d" = 2026-01-02T03:04:05Z, "e" = 2026-01-02 }
sinks = ["hook"]
[[rules]]
name = "s"
source = "shop"
sinks = ["hook"]
  [rules.filter]
  z = 1
  a = 2
[[rules]]
name = "t"
source = "shop"
sinks = ["hook"]
filter."fullDocument.status" = "paid"
filter.operationType = { "$in" = ["insert"] }
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules[0]
	want := bson.D{
		{Key: "fullDocument.z", Value: "paid"},
		{Key: "fullDocument.a", Value: bson.D{{Key: "$gte", Value: int64(100)}, {Key: "$lt", Value: 1500.0}}},
		{Key: "$or", Value: bson.A{bson.D{{Key: "b", Value: true}}, bson.D{{Key: "c", Value: bson.D{{Key: "$in", Value: bson.A{int64(1), "x"}}}}}}},
		{Key: "d", Value: bson.NewDateTimeFromTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))},
		{Key: "e", Value: bson.NewDateTimeFromTime(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))},
	}
	if !reflect.DeepEqual(r.Filter, want) {
		t.Errorf("filter =\n%#v\nwant\n%#v", r.Filter, want)
	}
	if want := (bson.D{{Key: "z", Value: int64(1)}, {Key: "a", Value: int64(2)}}); !reflect.DeepEqual(cfg.Rules[1].Filter, want) {
		t.Errorf("[rules.filter] = %#v, want %#v", cfg.Rules[1].Filter, want)
	}
	if want := (bson.D{{Key: "fullDocument.status", Value: "paid"}, {Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert"}}}}}); !reflect.DeepEqual(cfg.Rules[2].Filter, want) {
		t.Errorf("dotted filter keys = %#v, want %#v", cfg.Rules[2].Filter, want)
	}
	if !reflect.DeepEqual(r.Operations, []string{"update", "insert"}) {
		t.Errorf("operations = %v", r.Operations)
	}
	if want := []Namespace{{Database: "shop", Collection: "orders"}, {Database: "shop"}}; !reflect.DeepEqual(r.Namespaces, want) {
		t.Errorf("namespaces = %v", r.Namespaces)
	}
	if !r.Namespaces[1].Match("shop", "anything") || !r.Namespaces[1].Match("shop", "") || r.Namespaces[0].Match("shop", "other") || r.Namespaces[0].Match("x", "orders") {
		t.Errorf("Namespace.Match is wrong")
	}
	if got := r.Namespaces[1].String(); got != "shop.*" {
		t.Errorf("Namespace.String() = %q", got)
	}

	s := cfg.Sources[0]
	if !s.StartAt.Equal(time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)) {
		t.Errorf("start_at = %v", s.StartAt)
	}
	if !cfg.Sources[1].StartAt.Equal(time.Date(2026, 11, 22, 10, 0, 0, 5e8, time.UTC)) {
		t.Errorf("start_at string = %v", cfg.Sources[1].StartAt)
	}
	wantPipeline := []bson.D{
		{{Key: "$match", Value: bson.D{{Key: "ns.coll", Value: bson.D{{Key: "$ne", Value: "tmp"}}}}}},
		{{Key: "$set", Value: bson.D{
			{Key: "at", Value: bson.NewDateTimeFromTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
			{Key: "n", Value: int64(7)},
		}}},
	}
	if !reflect.DeepEqual(s.Pipeline, wantPipeline) {
		t.Errorf("pipeline =\n%#v\nwant\n%#v", s.Pipeline, wantPipeline)
	}
	if s.Level() != "database" || cfg.Sources[1].Level() != "cluster" {
		t.Errorf("levels: %s %s", s.Level(), cfg.Sources[1].Level())
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "changegate.toml")
	if err := os.WriteFile(path, []byte("[mongo]\nuri = \"mongodb://localhost\"\nfoo = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Load error %v is not an *Error", err)
	}
	want := Error{Key: "mongo.foo", Msg: "unknown key", File: path, Line: 3}
	if *e != want {
		t.Errorf("got %#v, want %#v", *e, want)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func TestErrorsAreJoined(t *testing.T) {
	_, err := Parse("c.toml", src(`
[mongo]
uri = 1
bogus = true
`), nil)
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("%T does not unwrap to []error", err)
	}
	var got []Error
	for _, e := range joined.Unwrap() {
		got = append(got, *e.(*Error))
	}
	want := []Error{
		{Key: "mongo.uri", Msg: "expected a string, got integer", File: "c.toml", Line: 2},
		{Key: "mongo.bogus", Msg: "unknown key", File: "c.toml", Line: 3},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %#v, want %#v", got, want)
	}
}

func TestSuggest(t *testing.T) {
	tests := []struct {
		in         string
		candidates []string
		want       string
	}{
		{"colection", []string{"collection", "database"}, "collection"},
		{"audit-q", []string{"audit", "billing"}, "audit"},
		{"URL", []string{"url"}, "url"},
		{"xyz", []string{"url", "name"}, ""},
		{"timeoutt", []string{"timeout", "batch_wait"}, "timeout"},
	}
	for _, tt := range tests {
		if got := suggest(tt.in, tt.candidates); got != tt.want {
			t.Errorf("suggest(%q, %q) = %q, want %q", tt.in, tt.candidates, got, tt.want)
		}
	}
}

func TestCAFileAndInlineArrays(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(filepath.Join(dir, "config.toml"), src(`
sources = [ { name = "a" }, { name = "b", database = "db" } ]
sinks = [ { name = "s", type = "webhook", url = "https://example.com/", tls_ca_file = "ca.pem", retry = { jitter = 0 } } ]
rules = [ { name = "r", source = "b", sinks = ["s"] } ]
[mongo]
uri = "mongodb+srv://cluster.example.com"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Sources) != 2 || cfg.Sources[1].Database != "db" || len(cfg.Rules) != 1 {
		t.Errorf("inline arrays of tables decoded wrong: %+v", cfg)
	}
	w := cfg.Sinks[0].Webhook
	if want := filepath.Join(dir, "ca.pem"); w.TLSCAFile != want {
		t.Errorf("tls_ca_file = %q, want %q", w.TLSCAFile, want)
	}
	if cfg.Sinks[0].Retry.Jitter != 0 || cfg.Sinks[0].Retry.MaxAttempts != 8 {
		t.Errorf("retry = %+v", cfg.Sinks[0].Retry)
	}
}

// A UTF-8 byte order mark, as some editors write, is not an error and does
// not shift line numbers.
func TestByteOrderMark(t *testing.T) {
	_, err := Parse("config.toml", []byte("\xef\xbb\xbf[mongo]\nuri = \"mongodb://localhost\"\nbogus = 1\n"), nil)
	if err == nil || err.Error() != "mongo.bogus: unknown key at config.toml:3" {
		t.Fatalf("got %v", err)
	}
}

func TestSinkConcurrencyAndRate(t *testing.T) {
	cfg, err := Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"
[[sinks]]
name = "fixed"
type = "webhook"
url = "http://localhost:8080/"
max_in_flight = 32
rate_limit = "30000/m"
[[sinks]]
name = "auto"
type = "webhook"
url = "http://localhost:8080/"
max_in_flight = "${CONCURRENCY:-auto}"
max_in_flight_min = 4
max_in_flight_max = 256
rate_limit = "10/100ms"
rate_limit_burst = 5
[[sinks]]
name = "slow"
type = "sqs"
queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/q"
rate_limit = "1/2s"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	type lim struct {
		fixed, lo, hi int
		rate          float64
		burst         int
	}
	for i, want := range []lim{{32, 0, 0, 500, 500}, {0, 4, 256, 100, 5}, {0, 1, 0, 0.5, 1}} {
		s := cfg.Sinks[i]
		got := lim{s.MaxInFlight, s.MaxInFlightMin, s.MaxInFlightMax, s.RateLimit, s.RateLimitBurst}
		if got != want {
			t.Errorf("sink %s: got %+v, want %+v", s.Name, got, want)
		}
	}
}

func TestMaxInFlightBytes(t *testing.T) {
	cfg, err := Parse("c.toml", []byte("\n# budget\nmax_in_flight_bytes = 134217728\n[mongo]\nuri = \"mongodb://localhost\"\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxInFlightBytes != 128<<20 || cfg.MaxInFlightBytesLine != 3 {
		t.Fatalf("got %d at line %d", cfg.MaxInFlightBytes, cfg.MaxInFlightBytesLine)
	}
	if err := cfg.CheckContainerLimit(0); err != nil {
		t.Fatalf("no container limit: %v", err)
	}
	if err := cfg.CheckContainerLimit(128 << 20); err != nil {
		t.Fatalf("equal to the limit: %v", err)
	}
	err = cfg.CheckContainerLimit(64 << 20)
	if err == nil || err.Error() != "max_in_flight_bytes: must not exceed the container's memory limit (67108864 bytes), got 134217728 at c.toml:3" {
		t.Fatalf("err = %v", err)
	}
	cfg, _ = Parse("c.toml", []byte("[mongo]\nuri = \"mongodb://localhost\"\n"), nil)
	if cfg.MaxInFlightBytes != 0 || cfg.CheckContainerLimit(1) != nil {
		t.Fatal("unset max_in_flight_bytes")
	}
}

// TestSourceOfTheStateDatabase: a database-level source of
// mongo.state_database is refused with its file:line; one collection of it
// may be watched on purpose (the dead-letter collection); a cluster-level
// source is accepted (the state database is left out of its stream).
func TestSourceOfTheStateDatabase(t *testing.T) {
	head := `
[mongo]
uri = "mongodb://localhost:27017"
%s
[[sources]]
name = "a"
%s
`
	for _, tc := range []struct{ mongo, source, want string }{
		{"", `database = "changegate"`, `sources[0].database: "changegate" is changegate's own state database (mongo.state_database): its checkpoint saves and dead letters would become events of this source; watch another database, set mongo.state_database to one no source watches, or name one collection of it (collection = "deadletters") to watch dead letters on purpose at c.toml:6`},
		{`state_database = "cg_state"`, `database = "cg_state"`, `sources[0].database: "cg_state" is changegate's own state database`},
		{`state_database = "cg_state"`, "database = \"cg_state\"\ncollection = \"deadletters\"", ``},
		{`state_database = "cg_state"`, `database = "changegate"`, ``},
		{"", ``, ``},
	} {
		_, err := Parse("c.toml", src(fmt.Sprintf(head, tc.mongo, tc.source)), nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q/%q: %v", tc.mongo, tc.source, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q/%q: %v, want %q", tc.mongo, tc.source, err, tc.want)
		}
	}
}

func TestTraceContext(t *testing.T) {
	parse := func(v string) (*Config, error) {
		return Parse("config.toml", src(`
[mongo]
uri = "mongodb://localhost"

[[sources]]
name = "orders"

[[sinks]]
name = "hook"
type = "webhook"
url = "http://localhost:8080/"
trace_context = `+v+`

[[rules]]
name = "all"
source = "orders"
sinks = ["hook"]
`), nil)
	}
	cfg, err := parse("false")
	if err != nil || cfg.Sinks[0].TraceContext {
		t.Fatalf("trace_context = false: %v, %+v", err, cfg)
	}
	if _, err := parse(`"no"`); err == nil || !strings.Contains(err.Error(), "sinks[0].trace_context") || !strings.Contains(err.Error(), "config.toml:11") {
		t.Fatalf("trace_context = \"no\": %v", err)
	}
}
