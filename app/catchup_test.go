package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/subscription"
	"github.com/changegate/changegate/test/mongotest"
)

// A subscription receives every change committed after its creation,
// including those written before the gateway's next poll applies it
// (caught up from the oplog while its sink is held), each document's
// changes in order; the file's sink receives each change once.
func TestSubscriptionCatchUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := newDocReceiver(t)
	sub := newDocReceiver(t)
	cfg := e.config(hook.srv.URL, "5s")
	cfg.Subscriptions = subscriptionsOn()
	g := start(t, cfg, app.Options{})
	client := mongotest.Client(t, e.uri)
	coll := client.Database(e.db).Collection("items")
	sealer, err := subscription.NewSealer([]byte(testSubscriptionKey))
	if err != nil {
		t.Fatal(err)
	}
	store := subscription.NewStore(client.Database(e.state), subscription.Options{Sealer: sealer, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A change before the subscription: not for it.
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the file's sink receives the first change", func() bool { return len(hook.got()) == 1 })

	body := fmt.Sprintf(`{"name":"team-a-items","source":"items","sink":{"type":"webhook","url":%q}}`, sub.srv.URL)
	_, spec, problems := (&subscription.Validator{Config: cfg}).Validate(ctx, []byte(body))
	if problems != nil {
		t.Fatal(problems)
	}
	if _, _, err := store.Create(ctx, "team-a", "team-a-items", spec, 10); err != nil {
		t.Fatal(err)
	}
	// Right after the creation, before the next poll applies it: an
	// insert and updates of two documents, then more while it is applied.
	write := func(id, v int) {
		t.Helper()
		var err error
		if v == 1 {
			_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "v", Value: v}})
		} else {
			_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: v}}}})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	written := 0
	for v := 1; v <= 5; v++ {
		write(2, v)
		write(3, v)
		written += 2
	}
	appliedEarly := false
	if _, ok := sinkParked(t, g.admin, "team-a-items"); ok {
		appliedEarly = true // the poll came first: the test shows less
	}
	for v := 6; v <= 40; v++ {
		write(2, v)
		write(3, v)
		written += 2
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, 20*time.Second, "the subscription receives every change after its creation", func() bool { return len(subDocs(t, sub)) >= written })
	time.Sleep(200 * time.Millisecond)
	got := subDocs(t, sub)
	last := map[int]int{}
	for _, d := range got {
		if d.id == 1 && last[1] == 0 {
			// Written just before the creation: the subscription's
			// cluster time is the last write's, so it may get it (once).
			last[1] = -1
			continue
		}
		if d.v != last[d.id]+1 {
			t.Fatalf("document %d: v=%d after v=%d (want each change once, in order): %v", d.id, d.v, last[d.id], got)
		}
		last[d.id] = d.v
	}
	if last[2] != 40 || last[3] != 40 {
		t.Errorf("the subscription received %v", got)
	}
	waitFor(t, 10*time.Second, "the file's sink receives everything", func() bool { return len(hook.got()) == 1+written })
	time.Sleep(200 * time.Millisecond)
	if n := len(hook.got()); n != 1+written {
		t.Errorf("the file's sink received %d changes, want %d (each once)", n, 1+written)
	}
	t.Logf("applied before the first changes were written: %v", appliedEarly)
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

type docVersion struct{ id, v int }

// subDocs returns the (document _id, v) of each change the receiver got:
// v from the inserted document or the update's fields.
func subDocs(t *testing.T, r *docReceiver) []docVersion {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []docVersion
	for _, b := range r.body {
		var ev struct {
			DocumentKey struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
			FullDocument *struct {
				V int `json:"v"`
			} `json:"fullDocument"`
			UpdateDescription *struct {
				UpdatedFields struct {
					V int `json:"v"`
				} `json:"updatedFields"`
			} `json:"updateDescription"`
		}
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Errorf("body %s: %v", b, err)
			continue
		}
		d := docVersion{id: ev.DocumentKey.ID}
		switch {
		case ev.FullDocument != nil:
			d.v = ev.FullDocument.V
		case ev.UpdateDescription != nil:
			d.v = ev.UpdateDescription.UpdatedFields.V
		}
		out = append(out, d)
	}
	return out
}

// A subscription created through the API with "backfill": true receives
// the documents that exist (as "snapshot" events its filter selects) once
// it is applied, besides the changes after its creation; one whose
// operations leave snapshots out is refused; a patch cannot ask for one.
func TestSubscriptionBackfill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := newDocReceiver(t)
	sub := newDocReceiver(t)
	cfg := e.config(hook.srv.URL, "5s")
	cfg.Subscriptions = subscriptionsOn()
	g := start(t, cfg, app.Options{})
	coll := mongotest.Client(t, e.uri).Database(e.db).Collection("items")
	ctx := context.Background()
	for i := 1; i <= 6; i++ {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "v", Value: i}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the file's sink receives the inserts", func() bool { return len(hook.got()) == 6 })
	const token = "s3cret-admin-token"
	body := func(extra string) string {
		return fmt.Sprintf(`{"name":"team-a-items","source":"items","filter":{"documentKey._id":{"$gte":3}},"sink":{"type":"webhook","url":%q}%s}`, sub.srv.URL, extra)
	}
	if code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions", token, body(`,"operations":["insert"],"backfill":true`)); code != 400 ||
		!strings.Contains(fmt.Sprint(out["problems"]), `$.backfill: a backfill sends the existing documents as "snapshot" events`) {
		t.Errorf("backfill without snapshots: %d %v", code, out)
	}
	if code, out := apiCall(t, g.admin, "POST", "/api/v1/subscriptions", token, body(`,"backfill":true`)); code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 6}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 60}}}}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Log(g.log.text(), sub.got())
		}
	}()
	waitFor(t, 20*time.Second, "the backfill and the update", func() bool { return len(sub.got()) >= 5 })
	time.Sleep(300 * time.Millisecond)
	sub.mu.Lock()
	var snaps []int
	updates := 0
	for _, b := range sub.body {
		var ev struct {
			OperationType string `json:"operationType"`
			DocumentKey   struct {
				ID int `json:"_id"`
			} `json:"documentKey"`
		}
		_ = json.Unmarshal(b, &ev)
		switch ev.OperationType {
		case "snapshot":
			snaps = append(snaps, ev.DocumentKey.ID)
		case "update":
			updates++
		}
	}
	sub.mu.Unlock()
	if !slices.Equal(slices.Sorted(slices.Values(snaps)), []int{3, 4, 5, 6}) || updates != 1 {
		t.Errorf("the subscription got snapshots of %v and %d updates, want 3..6 and the update", snaps, updates)
	}
	if code, out := apiCall(t, g.admin, "PATCH", "/api/v1/subscriptions/team-a-items", token, `{"backfill":false}`); code != 400 {
		t.Errorf("a patch of backfill: %d %v", code, out)
	}
	if code, out := apiCall(t, g.admin, "PATCH", "/api/v1/subscriptions/team-a-items", token, `{"filter":{"documentKey._id":{"$gte":4}}}`); code != 200 {
		t.Errorf("a patch of a subscription created with a backfill: %d %v", code, out)
	}
	if len(hook.got()) != 7 {
		t.Errorf("the file's sink got %d, want 7 changes", len(hook.got()))
	}
	if err := g.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
