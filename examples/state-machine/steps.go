// Package statemachine is the receiving half of the state-machine example:
// small HTTP handlers that play the Lambdas of a job workflow driven by
// changegate (see README.md and changegate.toml in this directory).
//
// A job document moves through states; every state change is a change event
// that changegate routes, by the rules in changegate.toml, to the handler of
// the next step, which does its work and writes the next state back to
// MongoDB:
//
//	pending ─► step1 ─┬─► step2a (sets a) ─┬─► join ─► step2 ─┬─ express ─────────────► finish ─► done
//	                  └─► step2b (sets b) ─┘                  └─ otherwise ─► review ─► step3 ─► finish ─► done
//	poison job: step1 answers 422 ─► dead letter ─► mark-failed ─► failed
//
// Exactly once per event: a step's effect and the record that it ran for a
// given event are one atomic, conditional update of the job document
// ("runs" holds "<step>/<webhook-id>"; the update matches only when the key
// is absent and the job is in the state the step expects). A re-delivery of
// the same event (same webhook-id, e.g. after changegate was killed) finds
// the key and is answered 200 without running again; a concurrent delivery
// of the same event loses the race on the conditional update. The same
// condition makes the join safe: both parallel steps may finish at once,
// but only the update whose post-image holds both results (and whose
// pre-image lacked one) triggers the join, and the join's update only
// matches a job still in step1, so exactly one transition to step2 happens.
package statemachine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/receive"
)

// Job states.
const (
	StatePending = "pending"
	StateStep1   = "step1"
	StateStep2   = "step2"
	StateStep3   = "step3"
	StateDone    = "done"
	StateFailed  = "failed"
)

// Step names: each is a handler path (/<name>) and a sink in changegate.toml.
const (
	StepStep1      = "step1"
	StepStep2a     = "step2a"
	StepStep2b     = "step2b"
	StepJoin       = "join"
	StepReview     = "review"
	StepFinish     = "finish"
	StepMarkFailed = "mark-failed"
)

// Steps lists every step name.
var Steps = []string{StepStep1, StepStep2a, StepStep2b, StepJoin, StepReview, StepFinish, StepMarkFailed}

// Job is the part of a job document the steps read (from the envelope's
// fullDocument, relaxed Extended JSON).
type Job struct {
	ID       string `json:"_id"`
	State    string `json:"state"`
	Priority string `json:"priority"` // "express" skips the review step
	Poison   bool   `json:"poison"`   // step1 refuses it for good
	Flaky    bool   `json:"flaky"`    // step2a fails once (503) per event
	A        any    `json:"a"`
	B        any    `json:"b"`
}

// Outcome is what a handler did with one delivery.
type Outcome string

// Outcomes.
const (
	// Ran: the step's effect was committed for this event.
	Ran Outcome = "ran"
	// Duplicate: the step already ran for this event id; nothing done.
	Duplicate Outcome = "duplicate"
	// Stale: the job is not in the state the step expects; nothing done.
	Stale Outcome = "stale"
	// Refused: the step refused the job for good (4xx: dead letter).
	Refused Outcome = "refused"
	// Failed: a transient failure (5xx: changegate retries).
	Failed Outcome = "failed"
)

// Delivery is one request a handler answered, recorded for tests and logs.
type Delivery struct {
	Step      string
	WebhookID string
	Job       string
	Outcome   Outcome
}

// Workflow runs the steps against the jobs collection. It is safe for
// concurrent use. The HTTP Handler and a Lambda handler
// (examples/lambda/step) both call Run.
type Workflow struct {
	jobs *mongo.Collection

	mu        sync.Mutex
	flakySeen map[string]bool // step2a events already failed once
}

// NewWorkflow returns the workflow of the jobs collection (the one the
// "jobs" source watches).
func NewWorkflow(jobs *mongo.Collection) *Workflow {
	return &Workflow{jobs: jobs, flakySeen: map[string]bool{}}
}

// Handler serves the steps over HTTP at /<step>, verifying each request's
// Standard Webhooks signature. It is safe for concurrent use.
type Handler struct {
	wf       *Workflow
	verifier *receive.Verifier
	log      *slog.Logger

	mu         sync.Mutex
	deliveries []Delivery
}

// NewHandler returns the HTTP handler of wf, verifying requests with the
// sinks' webhook secrets.
func NewHandler(wf *Workflow, log *slog.Logger, secrets ...string) (*Handler, error) {
	v, err := receive.NewVerifier(secrets...)
	if err != nil {
		return nil, err
	}
	return &Handler{wf: wf, verifier: v, log: log}, nil
}

// Deliveries returns a copy of every delivery answered so far.
func (h *Handler) Deliveries() []Delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.deliveries)
}

// ServeHTTP verifies the request, decodes the envelope and runs the step
// named by the path. It answers 200 when the step ran or had nothing to do,
// 422 when it refused the job for good (changegate dead-letters the event)
// and 503 on a transient failure (changegate retries).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	step := strings.TrimPrefix(r.URL.Path, "/")
	if !slices.Contains(Steps, step) || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	msg, err := h.verifier.Request(r, 1<<20)
	if err != nil {
		http.Error(w, err.Error(), receive.StatusFor(err))
		return
	}
	env, err := receive.Decode(msg.Body) // the sinks have batch_size = 1
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The step finishes even if changegate hangs up (a timeout, a crash):
	// abandoning the write half way would leave the outcome unknown; the
	// re-delivery then finds it done (like a Lambda, which runs to the end
	// whatever its caller does).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	jobID, out, err := h.wf.Run(ctx, step, msg.ID, &env)
	h.mu.Lock()
	h.deliveries = append(h.deliveries, Delivery{Step: step, WebhookID: msg.ID, Job: jobID, Outcome: out})
	h.mu.Unlock()
	switch out {
	case Refused:
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
	case Failed:
		h.log.Warn("step failed, changegate will retry", "step", step, "job", jobID, "err", err)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		fmt.Fprintln(w, out)
	}
}

// transition is a step's result: the state the job must be in (filter) and
// what to set.
type transition struct {
	filter bson.D
	set    bson.D
}

// Run runs step for one event: env is the envelope, eventID its
// deduplication key (the webhook-id header, or the envelope's id when the
// event comes without one, as in a Lambda invocation). It returns the job's
// id and what it did; the error explains Refused and Failed. An unknown step
// is Refused.
func (wf *Workflow) Run(ctx context.Context, step, eventID string, env *receive.Envelope) (string, Outcome, error) {
	webhookID := eventID
	if step == StepMarkFailed {
		return wf.markFailed(ctx, webhookID, env)
	}
	var job Job
	if err := json.Unmarshal(env.FullDocument, &job); err != nil || job.ID == "" {
		return "", Refused, fmt.Errorf("envelope %s: no job in fullDocument: %v", env.ID, err)
	}
	var tr transition
	switch step {
	case StepStep1:
		if job.Poison {
			return job.ID, Refused, fmt.Errorf("job %s cannot be processed", job.ID)
		}
		tr = transition{bson.D{{Key: "state", Value: StatePending}}, bson.D{{Key: "state", Value: StateStep1}}}
	case StepStep2a, StepStep2b:
		field := "a"
		if step == StepStep2b {
			field = "b"
		}
		if step == StepStep2a && job.Flaky && wf.failOnce(webhookID) {
			return job.ID, Failed, errors.New("flaky job: first attempt fails")
		}
		// Each parallel branch sets only its own field, and only while the
		// job waits in step1.
		tr = transition{bson.D{{Key: "state", Value: StateStep1}}, bson.D{{Key: field, Value: step + " result for " + job.ID}}}
	case StepJoin:
		// Both results present: the one transition to step2. If both
		// branches' updates raced, the post-image of only the second one
		// holds both; the condition on the state makes the join run once
		// even if it were delivered for both.
		tr = transition{bson.D{
			{Key: "state", Value: StateStep1},
			{Key: "a", Value: bson.D{{Key: "$exists", Value: true}}},
			{Key: "b", Value: bson.D{{Key: "$exists", Value: true}}},
		}, bson.D{{Key: "state", Value: StateStep2}}}
	case StepReview:
		tr = transition{bson.D{{Key: "state", Value: StateStep2}}, bson.D{{Key: "state", Value: StateStep3}}}
	case StepFinish:
		// Reached from step2 (express branch) or step3 (after review).
		from := StateStep3
		if job.Priority == "express" {
			from = StateStep2
		}
		tr = transition{bson.D{{Key: "state", Value: from}}, bson.D{{Key: "state", Value: StateDone}}}
	default:
		return job.ID, Refused, fmt.Errorf("unknown step %q", step)
	}
	out, err := wf.commit(ctx, step, webhookID, job.ID, tr)
	return job.ID, out, err
}

// failOnce reports whether this is the first time webhookID is seen.
func (wf *Workflow) failOnce(webhookID string) bool {
	wf.mu.Lock()
	defer wf.mu.Unlock()
	if wf.flakySeen[webhookID] {
		return false
	}
	wf.flakySeen[webhookID] = true
	return true
}

// commit applies tr to the job and records "<step>/<webhook-id>" in runs, in
// one conditional update: it matches only a job in the expected state on
// which this step has not run for this event.
func (wf *Workflow) commit(ctx context.Context, step, webhookID, jobID string, tr transition) (Outcome, error) {
	key := step + "/" + webhookID
	filter := append(bson.D{
		{Key: "_id", Value: jobID},
		{Key: "runs", Value: bson.D{{Key: "$ne", Value: key}}},
	}, tr.filter...)
	update := bson.D{
		{Key: "$set", Value: tr.set},
		{Key: "$push", Value: bson.D{{Key: "runs", Value: key}}},
	}
	res, err := wf.jobs.UpdateOne(ctx, filter, update)
	if err != nil {
		return Failed, fmt.Errorf("job %s: %s: %w", jobID, step, err)
	}
	if res.MatchedCount == 1 {
		return Ran, nil
	}
	n, err := wf.jobs.CountDocuments(ctx, bson.D{{Key: "_id", Value: jobID}, {Key: "runs", Value: key}})
	if err != nil {
		return Failed, fmt.Errorf("job %s: %s: %w", jobID, step, err)
	}
	if n > 0 {
		return Duplicate, nil
	}
	return Stale, nil
}

// deadLetter is the part of a changegate dead-letter entry mark-failed reads
// (the fullDocument of an event of the dead-letter collection).
type deadLetter struct {
	Kind        string          `json:"kind"`
	Source      string          `json:"source"`
	Sink        string          `json:"sink"`
	Namespace   string          `json:"namespace"`
	DocumentKey json.RawMessage `json:"documentKey"`
	Reason      string          `json:"reason"`
	LastError   string          `json:"lastError"`
}

// markFailed marks the job of a dead-lettered step failed, unless it already
// reached done or failed.
func (wf *Workflow) markFailed(ctx context.Context, webhookID string, env *receive.Envelope) (string, Outcome, error) {
	var dl deadLetter
	if err := json.Unmarshal(env.FullDocument, &dl); err != nil {
		return "", Refused, fmt.Errorf("envelope %s: not a dead letter: %v", env.ID, err)
	}
	var key struct {
		ID string `json:"_id"`
	}
	if err := json.Unmarshal(dl.DocumentKey, &key); err != nil || key.ID == "" {
		return "", Refused, fmt.Errorf("dead letter %s: no job id in documentKey %s", env.ID, dl.DocumentKey)
	}
	if want := wf.jobs.Database().Name() + "." + wf.jobs.Name(); dl.Namespace != want {
		return key.ID, Refused, fmt.Errorf("dead letter %s is for %s, not %s", env.ID, dl.Namespace, want)
	}
	reason := dl.LastError
	if len(reason) > 200 {
		reason = reason[:200]
	}
	out, err := wf.commit(ctx, StepMarkFailed, webhookID, key.ID, transition{
		bson.D{{Key: "state", Value: bson.D{{Key: "$nin", Value: bson.A{StateDone, StateFailed}}}}},
		bson.D{{Key: "state", Value: StateFailed}, {Key: "failedStep", Value: dl.Sink}, {Key: "failure", Value: reason}},
	})
	return key.ID, out, err
}
