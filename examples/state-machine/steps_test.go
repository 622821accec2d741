package statemachine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	sm "github.com/changegate/changegate/examples/state-machine"
	"github.com/changegate/changegate/receive"
	"github.com/changegate/changegate/sinks/webhook"
	"github.com/changegate/changegate/test/mongotest"
)

// jobEnvelope is an envelope whose fullDocument is job.
func jobEnvelope(t *testing.T, id string, job bson.M) *receive.Envelope {
	t.Helper()
	doc, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	return &receive.Envelope{ID: id, Source: "jobs", OperationType: "update", FullDocument: doc}
}

func jobsCollection(t *testing.T, n int, state string) *mongo.Collection {
	t.Helper()
	coll := mongotest.Database(t, "smsteps_").Collection("jobs")
	var docs []any
	for i := range n {
		docs = append(docs, bson.M{"_id": fmt.Sprintf("job-%d", i), "state": state, "priority": "standard"})
	}
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatal(err)
	}
	return coll
}

// TestParallelBranchesJoinOnce runs both parallel steps of each job at the
// same time, then the join twice at the same time under two different event
// ids (as if the join rule had fired twice): each job moves to step2
// exactly once, with both results.
func TestParallelBranchesJoinOnce(t *testing.T) {
	const jobs = 40
	coll := jobsCollection(t, jobs, sm.StateStep1)
	wf := sm.NewWorkflow(coll)
	ctx := t.Context()
	run := func(step, eventID string, i int) sm.Outcome {
		_, out, err := wf.Run(ctx, step, eventID, jobEnvelope(t, eventID, bson.M{"_id": fmt.Sprintf("job-%d", i), "state": sm.StateStep1}))
		if err != nil {
			t.Errorf("%s job-%d: %v", step, i, err)
		}
		return out
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	joined := map[int][]sm.Outcome{}
	for i := range jobs {
		wg.Go(func() {
			var branches sync.WaitGroup
			for _, step := range []string{sm.StepStep2a, sm.StepStep2b} {
				branches.Go(func() {
					if out := run(step, fmt.Sprintf("jobs:fork-%d", i), i); out != sm.Ran {
						t.Errorf("%s job-%d: %s, want ran", step, i, out)
					}
				})
			}
			branches.Wait()
			var joins sync.WaitGroup
			for k := range 2 {
				joins.Go(func() {
					out := run(sm.StepJoin, fmt.Sprintf("jobs:join-%d-%d", i, k), i)
					mu.Lock()
					joined[i] = append(joined[i], out)
					mu.Unlock()
				})
			}
			joins.Wait()
		})
	}
	wg.Wait()
	for i := range jobs {
		outs := joined[i]
		if len(outs) != 2 || !((outs[0] == sm.Ran && outs[1] == sm.Stale) || (outs[0] == sm.Stale && outs[1] == sm.Ran)) {
			t.Errorf("job-%d: joins %v, want one ran and one stale", i, outs)
		}
	}
	n, err := coll.CountDocuments(ctx, bson.M{"state": sm.StateStep2, "a": bson.M{"$exists": true}, "b": bson.M{"$exists": true}})
	if err != nil || n != jobs {
		t.Fatalf("%d jobs in step2 with both results (%v), want %d", n, err, jobs)
	}
}

// TestSameEventConcurrently delivers one event to a step several times at
// once: it runs once, the other deliveries are duplicates.
func TestSameEventConcurrently(t *testing.T) {
	coll := jobsCollection(t, 1, sm.StatePending)
	wf := sm.NewWorkflow(coll)
	env := jobEnvelope(t, "jobs:insert-0", bson.M{"_id": "job-0", "state": sm.StatePending})
	outs := make([]sm.Outcome, 8)
	var wg sync.WaitGroup
	for k := range outs {
		wg.Go(func() {
			var err error
			if _, outs[k], err = wf.Run(t.Context(), sm.StepStep1, env.ID, env); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	ran := 0
	for _, o := range outs {
		switch o {
		case sm.Ran:
			ran++
		case sm.Duplicate:
		default:
			t.Errorf("outcome %s, want ran or duplicate", o)
		}
	}
	if ran != 1 {
		t.Fatalf("outcomes %v: ran %d times, want once", outs, ran)
	}
	var job struct{ Runs []string }
	if err := coll.FindOne(t.Context(), bson.M{"_id": "job-0"}).Decode(&job); err != nil || len(job.Runs) != 1 {
		t.Fatalf("runs %v (%v), want one", job.Runs, err)
	}
}

// TestHandlerHTTP checks the HTTP side: signatures, status codes.
func TestHandlerHTTP(t *testing.T) {
	coll := jobsCollection(t, 1, sm.StatePending)
	h, err := sm.NewHandler(sm.NewWorkflow(coll), slog.New(slog.NewTextHandler(io.Discard, nil)), secret)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(path, id, body, signWith string) int {
		t.Helper()
		now := time.Now()
		sig, err := webhook.Sign([]string{signWith}, id, now, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const other = "whsec_c2Vjb25kLXNlY3JldC1vZi1hdC1sZWFzdC0yNC1ieXRlcw=="
	body := `{"id":"jobs:1","source":"jobs","operationType":"insert","fullDocument":{"_id":"job-0","state":"pending"},"rules":["start"]}`
	poison := `{"id":"jobs:2","source":"jobs","operationType":"insert","fullDocument":{"_id":"job-0","state":"pending","poison":true},"rules":["start"]}`
	for _, c := range []struct {
		name, path, id, body, secret string
		want                         int
	}{
		{"wrong secret", "/step1", "jobs:1", body, other, http.StatusUnauthorized},
		{"unknown step", "/step9", "jobs:1", body, secret, http.StatusNotFound},
		{"poison job", "/step1", "jobs:2", poison, secret, http.StatusUnprocessableEntity},
		{"runs", "/step1", "jobs:1", body, secret, http.StatusOK},
		{"re-delivery", "/step1", "jobs:1", body, secret, http.StatusOK},
	} {
		if got := post(c.path, c.id, c.body, c.secret); got != c.want {
			t.Errorf("%s: status %d, want %d", c.name, got, c.want)
		}
	}
	var outs []sm.Outcome
	for _, d := range h.Deliveries() {
		outs = append(outs, d.Outcome)
	}
	if fmt.Sprint(outs) != "[refused ran duplicate]" {
		t.Fatalf("outcomes %v, want [refused ran duplicate]", outs)
	}
}
