package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/test/mongotest"
)

// scopedDeliveries is the real delivery log's List, with a fixed lifecycle
// and fixed analytics.
type scopedDeliveries struct {
	*deliverylog.Log
	lc deliverylog.Lifecycle
	an deliverylog.Analytics
}

func (d scopedDeliveries) Lifecycle(context.Context, string) (deliverylog.Lifecycle, error) {
	lc := d.lc
	lc.Sinks = slices.Clone(lc.Sinks)
	return lc, nil
}

func (d scopedDeliveries) Analytics(context.Context, string, int64) (deliverylog.Analytics, error) {
	an := d.an
	an.Sinks, an.Rules = slices.Clone(an.Sinks), slices.Clone(an.Rules)
	return an, nil
}

// getJSON serves GET path with token and decodes the answer into out.
func getJSON(t *testing.T, s *Server, path, token string, out any) int {
	t.Helper()
	resp := call(s, "GET", path, token, "")
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

// TestScopedReads: a token scoped to team-a- reads the dead letters,
// deliveries, event lifecycles and analytics of the sinks whose names
// start with team-a- only: 403 for team-b-x's, none of team-b-x's in its
// listings, and a prefix is matched literally (the store's filter quotes
// it: "team.a-" does not match "teamXa-"); the admin sees everything.
func TestScopedReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := mongotest.Database(t, "cgtest_api_scoped_")
	dls := deadletter.NewStore(db, "deadletters")
	if err := dls.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	log := deliverylog.NewLog(db.Collection("deliveries"), 72*time.Hour, "all", deliverylog.Deps{})
	if err := log.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	w := deliverylog.NewWriter(log.Collection(), deliverylog.WriterOptions{Mode: "all", Replica: "r1", FlushEvery: time.Millisecond})
	w.Start()
	sinks := []string{"team-a-x", "team-b-x", "teamXa-y", "team.a-z"}
	for i, sink := range sinks {
		key, _ := bson.Marshal(bson.D{{Key: "_id", Value: i}})
		change, _ := bson.Marshal(bson.D{{Key: "_id", Value: bson.D{{Key: "_data", Value: "00" + sink}}}})
		if err := dls.Put(ctx, deadletter.Entry{Kind: deadletter.KindFailed, EventID: "orders:" + sink, Source: "orders", Sink: sink,
			Namespace: "shop.orders", DocumentKey: key, Change: change, LastError: "http 400"}); err != nil {
			t.Fatal(err)
		}
		w.Enqueue(deliverylog.Record{EventID: "orders:" + sink, Source: "orders", Sink: sink, Rules: []string{sink}, Attempt: 1,
			Outcome: deliverylog.OutcomeFailed, Status: 400, DocumentKey: key, Time: time.Now()})
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	var groups []deliverylog.Group
	var lcSinks []deliverylog.SinkLifecycle
	for _, sink := range sinks {
		groups = append(groups, deliverylog.Group{Name: sink})
		lcSinks = append(lcSinks, deliverylog.SinkLifecycle{Sink: sink, State: deliverylog.StateDelivered})
	}
	s := subscriptionFixture(t, Options{DeadLetters: dls, Deliveries: scopedDeliveries{Log: log,
		lc: deliverylog.Lifecycle{EventID: "orders:1", Sinks: lcSinks}, an: deliverylog.Analytics{Window: "24h", Sinks: groups, Rules: groups}}})
	s.subs.File().Server.Tokens = append(s.subs.File().Server.Tokens, fixtureToken{"team-dot", fixtureTeamDot, "team.a-"}.config())

	sinksOf := func(token, path, field string) []string {
		var page map[string]json.RawMessage
		if code := getJSON(t, s, path, token, &page); code != 200 {
			t.Fatalf("%s as %s: %d", path, token, code)
		}
		var items []struct {
			Sink string `json:"sink"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(page[field], &items); err != nil {
			t.Fatalf("%s as %s: %s: %v", path, token, field, err)
		}
		var out []string
		for _, e := range items {
			out = append(out, e.Sink+e.Name)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		token string
		want  []string
	}{
		{fixtureAdmin, []string{"team-a-x", "team-b-x", "team.a-z", "teamXa-y"}},
		{fixtureTeamA, []string{"team-a-x"}},
		{fixtureTeamB, []string{"team-b-x"}},
		{fixtureTeamDot, []string{"team.a-z"}},
	} {
		for _, q := range []struct{ path, field string }{
			{"/api/v1/deadletters", "entries"}, {"/api/v1/deliveries", "records"},
			{"/api/v1/events/orders:1", "sinks"}, {"/api/v1/analytics", "sinks"}, {"/api/v1/analytics", "rules"},
		} {
			if got := sinksOf(tc.token, q.path, q.field); !slices.Equal(got, tc.want) {
				t.Errorf("%s %s as %s: %v, want %v", q.path, q.field, tc.token, got, tc.want)
			}
		}
	}

	// 403 for another team's sink, asked by name.
	for _, path := range []string{"/api/v1/deadletters?sink=team-b-x", "/api/v1/deliveries?sink=team-b-x"} {
		if code := getJSON(t, s, path, fixtureTeamA, &struct{}{}); code != 403 {
			t.Errorf("%s as team-a: %d, want 403", path, code)
		}
	}
	var all struct {
		Entries []struct {
			ID   string `json:"id"`
			Sink string `json:"sink"`
		} `json:"entries"`
	}
	getJSON(t, s, "/api/v1/deadletters", fixtureAdmin, &all)
	for _, e := range all.Entries {
		want := 403
		if e.Sink == "team-a-x" {
			want = 200
		}
		if code := getJSON(t, s, "/api/v1/deadletters/"+e.ID, fixtureTeamA, &struct{}{}); code != want {
			t.Errorf("dead letter of %s as team-a: %d, want %d", e.Sink, code, want)
		}
	}
	// An event none of whose sinks is the token's: 403.
	d := s.deliveries.(scopedDeliveries)
	d.lc.Sinks = []deliverylog.SinkLifecycle{{Sink: "team-b-x", State: deliverylog.StateDelivered}}
	s.deliveries = d
	if code := getJSON(t, s, "/api/v1/events/orders:1", fixtureTeamA, &struct{}{}); code != 403 {
		t.Errorf("team-b-x's event as team-a: %d, want 403", code)
	}
	// Replay and purge stay the admin's.
	for _, m := range []string{"POST /api/v1/deadletters/replay?sink=team-a-x", "DELETE /api/v1/deadletters?sink=team-a-x"} {
		method, path, _ := strings.Cut(m, " ")
		if resp := call(s, method, path, fixtureTeamA, ""); resp.StatusCode != 401 {
			t.Errorf("%s as team-a: %d, want 401", m, resp.StatusCode)
		}
	}
}
