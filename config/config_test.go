package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
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
	if len(cfg.Sources) != 2 || len(cfg.Sinks) != 2 || len(cfg.Rules) != 2 {
		t.Fatalf("got %d sources, %d sinks, %d rules; want 2 each", len(cfg.Sources), len(cfg.Sinks), len(cfg.Rules))
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
		"listen", "shutdown_grace", "admin_token",
		"name", "database", "collection", "full_document", "full_document_before_change", "pipeline",
		"start_at", "on_history_lost", "batch_size", "max_await", "max_in_flight_events", "checkpoint_interval",
		"type", "max_in_flight", "ordering", "batch_wait", "json", "park_after",
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
		Server: Server{Listen: ":9464", ShutdownGrace: 30 * time.Second},
		Sources: []Source{{
			Name:                     "orders",
			FullDocument:             "default",
			FullDocumentBeforeChange: "off",
			OnHistoryLost:            HistoryLostFail,
			MaxAwait:                 time.Second,
			MaxInFlightEvents:        10000,
			CheckpointInterval:       time.Second,
		}},
		Sinks: []Sink{{
			Name:        "hook",
			Type:        "webhook",
			MaxInFlight: 16,
			Ordering:    OrderingKey,
			BatchSize:   1,
			JSON:        JSONRelaxed,
			ParkAfter:   30 * time.Second,
			Retry: Retry{
				MaxAttempts:     8,
				InitialInterval: 500 * time.Millisecond,
				MaxInterval:     time.Minute,
				MaxElapsed:      15 * time.Minute,
				Multiplier:      2,
				Jitter:          0.2,
			},
			Webhook: &WebhookSink{URL: "http://localhost:8080/", Timeout: 10 * time.Second},
		}},
		Rules: []Rule{{Name: "all", Source: "orders", Sinks: []string{"hook"}}},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got\n%#v\nwant\n%#v", cfg, want)
	}
	if got := cfg.Sources[0].Level(); got != "cluster" {
		t.Errorf("Level() = %q, want cluster", got)
	}
}
