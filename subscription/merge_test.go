package subscription_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/query"
	"github.com/changegate/changegate/subscription"
)

func TestMerge(t *testing.T) {
	f := newFixture(t, true)
	cfg := validatorConfig(t, false)
	mk := func(name, body string) subscription.Subscription {
		t.Helper()
		sub, _, err := f.store.Create(f.ctx, "admin", name, json.RawMessage(body), 10)
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
	active := mk("team-a-x", `{"name":"team-a-x","source":"orders","filter":{"fullDocument.total":{"$gte":100}},"sink":{"type":"webhook","url":"https://a.example.com/","batch_size":5}}`)
	paused := mk("team-a-p", `{"name":"team-a-p","source":"orders","sink":{"type":"webhook","url":"https://a.example.com/"}}`)
	paused.Status = subscription.StatusPaused
	gone := mk("team-a-gone", `{"name":"team-a-gone","source":"customers","sink":{"type":"webhook","url":"https://a.example.com/"}}`)
	clash := mk("billing", `{"name":"billing","source":"orders","sink":{"type":"webhook","url":"https://a.example.com/"}}`)

	merged, skipped := subscription.Merge(cfg, []subscription.Subscription{active, paused, gone, clash}, f.store.Sealer(), f.clock.now())
	if len(cfg.Sinks) != 1 || len(cfg.Rules) != 1 {
		t.Fatalf("Merge changed its input: %d sinks, %d rules", len(cfg.Sinks), len(cfg.Rules))
	}
	if len(merged.Sinks) != 3 || len(merged.Rules) != 3 || merged.Sinks[1].Name != "team-a-x" || merged.Rules[1].Name != "team-a-x" ||
		merged.Sinks[2].Name != "team-a-p" || merged.Rules[2].Name != "team-a-p" {
		t.Fatalf("merged sinks %v, rules %v", merged.Sinks, merged.Rules)
	}
	if merged.Sinks[1].Held || !merged.Sinks[2].Held {
		t.Errorf("held: active %v, paused %v", merged.Sinks[1].Held, merged.Sinks[2].Held)
	}
	sink := merged.Sinks[1]
	if sink.BatchSize != 5 || len(sink.Webhook.Secrets) != 1 || !strings.HasPrefix(sink.Webhook.Secrets[0].Value(), "whsec_") {
		t.Errorf("sink %+v", sink)
	}
	var reasons []string
	for _, s := range skipped {
		reasons = append(reasons, s.String())
	}
	want := []string{
		`team-a-gone: the configuration no longer accepts it: $.source: unknown source "customers"`,
		`billing: its name is now a sink or rule of the configuration file`,
	}
	if strings.Join(reasons, "\n") != strings.Join(want, "\n") {
		t.Errorf("skipped:\n%s\nwant\n%s", strings.Join(reasons, "\n"), strings.Join(want, "\n"))
	}

	// The rule matches only changes from the creation's cluster time on.
	raw, err := bson.Marshal(merged.Rules[1].Filter)
	if err != nil {
		t.Fatal(err)
	}
	flt, err := query.Compile(raw)
	if err != nil {
		t.Fatal(err)
	}
	ct := active.CreatedClusterTime
	for _, tc := range []struct {
		at    bson.Timestamp
		total float64
		want  bool
	}{
		{ct, 120, true},
		{bson.Timestamp{T: ct.T + 5, I: 1}, 120, true},
		{bson.Timestamp{T: ct.T + 5, I: 1}, 20, false},
		{bson.Timestamp{T: ct.T - 1, I: 9}, 120, false},
	} {
		doc, _ := bson.Marshal(bson.D{{Key: "clusterTime", Value: tc.at}, {Key: "fullDocument", Value: bson.D{{Key: "total", Value: tc.total}}}})
		if got := flt.Match(doc); got != tc.want {
			t.Errorf("change at %v total %v: match %v, want %v", tc.at, tc.total, got, tc.want)
		}
	}

	// Secrets that do not open (another key) leave the subscription out.
	other, _ := subscription.NewSealer(make([]byte, 32))
	merged, skipped = subscription.Merge(cfg, []subscription.Subscription{active}, other, time.Now())
	if len(merged.Sinks) != 1 || len(skipped) != 1 || !strings.Contains(skipped[0].Reason, "cannot be decrypted with the configured key") {
		t.Errorf("with another key: %d sinks, skipped %v", len(merged.Sinks), skipped)
	}
}
