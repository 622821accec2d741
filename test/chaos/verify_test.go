package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/changegate/changegate/sinks/webhook"
	"github.com/changegate/changegate/test/receiver"
)

// delivered is one envelope a receiver accepted, reduced to what the
// verifier needs.
type delivered struct {
	Doc       int32
	Change    change // Seq and Op identify the change; Global and At are not set
	EventID   string
	WebhookID string
	At        time.Time
}

// parseDelivery reads the document and the change from an envelope: seq comes
// from fullDocument (insert, replace), updateDescription.updatedFields
// (update) or the pre-image fullDocumentBeforeChange (delete).
func parseDelivery(d receiver.Delivery) (delivered, error) {
	type seqDoc struct {
		Seq json.Number `json:"seq"`
	}
	var env struct {
		ID            string `json:"id"`
		OperationType string `json:"operationType"`
		DocumentKey   struct {
			ID json.Number `json:"_id"`
		} `json:"documentKey"`
		FullDocument             *seqDoc `json:"fullDocument"`
		FullDocumentBeforeChange *seqDoc `json:"fullDocumentBeforeChange"`
		UpdateDescription        *struct {
			UpdatedFields seqDoc `json:"updatedFields"`
		} `json:"updateDescription"`
	}
	out := delivered{WebhookID: d.WebhookID, At: d.At}
	if err := json.Unmarshal(d.Envelope, &env); err != nil {
		return out, err
	}
	out.EventID = env.ID
	id, err := strconv.ParseInt(string(env.DocumentKey.ID), 10, 32)
	if err != nil {
		return out, fmt.Errorf("documentKey: %w", err)
	}
	out.Doc = int32(id)
	var s json.Number
	switch env.OperationType {
	case "insert", "replace":
		if env.FullDocument != nil {
			s = env.FullDocument.Seq
		}
	case "update":
		if env.UpdateDescription != nil {
			s = env.UpdateDescription.UpdatedFields.Seq
		}
	case "delete":
		if env.FullDocumentBeforeChange != nil {
			s = env.FullDocumentBeforeChange.Seq
		}
	default:
		return out, fmt.Errorf("unexpected operationType %q", env.OperationType)
	}
	seq, err := strconv.ParseInt(string(s), 10, 64)
	if err != nil {
		return out, fmt.Errorf("%s of %d: no seq (%q)", env.OperationType, id, s)
	}
	out.Change = change{Seq: seq, Op: env.OperationType}
	return out, nil
}

// report is the verdict on one sink's deliveries.
type report struct {
	Events     int // envelopes received
	Distinct   int // distinct changes among them
	Duplicates int // Events - Distinct
	Rewinds    int // deliveries older than the one before (replays)
	// Reorders: a change delivered before an earlier change of its document
	// that had not been delivered yet. ReplayGaps: after a rewind, a replay
	// that skipped changes it had delivered before.
	Reorders, ReplayGaps []string
	Lost                 []string // changes never delivered
	Final                []string // documents whose last delivery is not their last change
	IDs                  []string // one change delivered under several webhook-ids
	Unknown              []string // envelopes that are no change of the journal
}

// OK reports whether the sink met every check.
func (r *report) OK() bool {
	return len(r.Reorders)+len(r.ReplayGaps)+len(r.Lost)+len(r.Final)+len(r.IDs)+len(r.Unknown) == 0
}

// Summary is one line of counts.
func (r *report) Summary() string {
	return fmt.Sprintf("events %d, distinct %d, duplicates %d, rewinds %d, reorders %d, replay gaps %d, lost %d, wrong final state %d, webhook-id mismatches %d, unknown %d",
		r.Events, r.Distinct, r.Duplicates, r.Rewinds, len(r.Reorders), len(r.ReplayGaps), len(r.Lost), len(r.Final), len(r.IDs), len(r.Unknown))
}

// Details lists up to limit lines of each kind of violation.
func (r *report) Details(limit int) string {
	var b strings.Builder
	for _, g := range []struct {
		name  string
		lines []string
	}{{"reorders", r.Reorders}, {"replay gaps", r.ReplayGaps}, {"lost", r.Lost}, {"wrong final state", r.Final}, {"webhook-id mismatches", r.IDs}, {"unknown", r.Unknown}} {
		if len(g.lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s (%d):\n", g.name, len(g.lines))
		for i, l := range g.lines {
			if i == limit {
				fmt.Fprintf(&b, "    ... %d more\n", len(g.lines)-limit)
				break
			}
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	return b.String()
}

// isBatch reports whether a webhook-id is that of a batch request
// (webhook.BatchID).
func isBatch(webhookID string) bool { return strings.HasPrefix(webhookID, "batch_") }

func rel(t, t0 time.Time) string { return fmt.Sprintf("+%.3f s", t.Sub(t0).Seconds()) }

// verify checks one sink's deliveries (in arrival order) against the
// journal; t0 is the origin of the times in the report:
//
//	(a) every change of the journal was delivered at least once;
//	(b) each document's last delivery is its last change;
//	(c) per document, each delivery is either the next change after the
//	    previous delivery or a rewind to an older one (a replay after a
//	    restart or a stream reopen), which then goes forward again through
//	    every later change: a delivery never skips a change;
//	(d) every delivery of a change carries the same webhook-id, which is
//	    the envelope's id; a batch (a sink with batch_size > 1) carries
//	    webhook.BatchID of its envelopes' ids instead, which differs when a
//	    change is sent again in another batch.
func verify(j *journal, ds []receiver.Delivery, t0 time.Time) *report {
	r := &report{Events: len(ds)}
	byDoc := map[int32][]delivered{}
	var batch []string // ids of the batch request being read (consecutive deliveries)
	for i, d := range ds {
		p, err := parseDelivery(d)
		if err != nil {
			r.Unknown = append(r.Unknown, fmt.Sprintf("envelope %s at %s: %v", d.WebhookID, rel(d.At, t0), err))
			continue
		}
		if isBatch(p.WebhookID) {
			// The receiver records a request's envelopes together, with
			// its webhook-id and arrival time.
			batch = append(batch, p.EventID)
			if i+1 == len(ds) || ds[i+1].WebhookID != d.WebhookID || !ds[i+1].At.Equal(d.At) {
				if want := webhook.BatchID(batch); want != d.WebhookID {
					r.IDs = append(r.IDs, fmt.Sprintf("batch of %d at %s: webhook-id %s but its envelopes' ids make %s", len(batch), rel(p.At, t0), d.WebhookID, want))
				}
				batch = batch[:0]
			}
		} else if p.WebhookID != p.EventID {
			r.IDs = append(r.IDs, fmt.Sprintf("doc %d's %s at %s: webhook-id %s but envelope id %s", p.Doc, p.Change, rel(p.At, t0), p.WebhookID, p.EventID))
		}
		byDoc[p.Doc] = append(byDoc[p.Doc], p)
	}
	docs := make([]int32, 0, len(j.docs))
	for id := range j.docs {
		docs = append(docs, id)
	}
	for id := range byDoc {
		if _, ok := j.docs[id]; !ok {
			docs = append(docs, id)
		}
	}
	slices.Sort(docs)
	for _, id := range docs {
		r.checkDoc(id, j.docs[id], byDoc[id], t0)
	}
	r.Duplicates = r.Events - len(r.Unknown) - r.Distinct
	return r
}

func (r *report) checkDoc(id int32, jc []change, ds []delivered, t0 time.Time) {
	pos := make(map[int64]int, len(jc))
	for i, c := range jc {
		pos[c.key()] = i
	}
	seen := make([]bool, len(jc))
	webhookID := make([]string, len(jc))
	last := -1
	for i, d := range ds {
		p, ok := pos[d.Change.key()]
		if !ok {
			r.Unknown = append(r.Unknown, fmt.Sprintf("doc %d's %s at %s: not in the journal", id, d.Change, rel(d.At, t0)))
			continue
		}
		switch {
		case isBatch(d.WebhookID):
			// A batch's id names the batch (checked in verify).
		case webhookID[p] == "":
			webhookID[p] = d.WebhookID
		case webhookID[p] != d.WebhookID:
			r.IDs = append(r.IDs, fmt.Sprintf("doc %d's %s delivered as %s at %s, earlier as %s", id, jc[p], d.WebhookID, rel(d.At, t0), webhookID[p]))
		}
		switch {
		case p <= last:
			r.Rewinds++
		case p > last+1:
			r.skip(id, jc, ds, i, last, p, seen, t0)
		}
		if !seen[p] {
			seen[p] = true
			r.Distinct++
		}
		last = p
	}
	for p, ok := range seen {
		if !ok {
			r.Lost = append(r.Lost, fmt.Sprintf("doc %d's %s (written at %s) never delivered", id, jc[p], rel(jc[p].At, t0)))
		}
	}
	if len(jc) > 0 && last != len(jc)-1 {
		what := "nothing"
		if len(ds) > 0 {
			d := ds[len(ds)-1]
			what = fmt.Sprintf("%s (at %s)", d.Change, rel(d.At, t0))
		}
		r.Final = append(r.Final, fmt.Sprintf("doc %d: last delivered %s, but its last change is %s", id, what, jc[len(jc)-1]))
	}
}

// skip records that ds[i] (change p) was delivered right after change last,
// skipping the changes in between.
func (r *report) skip(id int32, jc []change, ds []delivered, i, last, p int, seen []bool, t0 time.Time) {
	missing := jc[last+1 : p]
	fresh := false // a skipped change not delivered yet: a true reorder
	for q := last + 1; q < p; q++ {
		fresh = fresh || !seen[q]
	}
	// When were the skipped changes delivered afterwards?
	var later []time.Time
	never := 0
	for q := last + 1; q < p; q++ {
		found := false
		for _, e := range ds[i+1:] {
			if e.Change.key() == jc[q].key() {
				later = append(later, e.At)
				found = true
				break
			}
		}
		if !found {
			never++
		}
	}
	what := missing[0].String()
	if len(missing) > 1 {
		what = fmt.Sprintf("changes %s … %s (%d)", missing[0], missing[len(missing)-1], len(missing))
	}
	when := ""
	if len(later) > 0 {
		slices.SortFunc(later, func(a, b time.Time) int { return a.Compare(b) })
		when = rel(later[0], t0)
		if len(later) > 1 {
			when += " … " + rel(later[len(later)-1], t0)
		}
		when = " (delivered later at " + when
		if never > 0 {
			when += fmt.Sprintf("; %d never", never)
		}
		when += ")"
	} else {
		when = " (never delivered later)"
	}
	msg := fmt.Sprintf("doc %d's %s delivered at %s before its %s%s", id, jc[p], rel(ds[i].At, t0), what, when)
	if fresh {
		r.Reorders = append(r.Reorders, msg)
	} else {
		r.ReplayGaps = append(r.ReplayGaps, msg+", all delivered before: a replay that skipped them")
	}
}

// retryAfterGaps measures, for every request answered 503 (with
// Retry-After), the time until the next request for the same event. Pairs
// with a process restart in between are left out: a new process knows
// nothing of the old one's Retry-After.
func retryAfterGaps(reqs []request, restarts []time.Time) []time.Duration {
	var gaps []time.Duration
	for i, r := range reqs {
		if r.Status != http.StatusServiceUnavailable || r.EventID == "" {
			continue
		}
		for _, n := range reqs[i+1:] {
			if n.EventID != r.EventID {
				continue
			}
			restarted := false
			for _, k := range restarts {
				restarted = restarted || (k.After(r.At) && k.Before(n.At))
			}
			if !restarted {
				gaps = append(gaps, n.At.Sub(r.At))
			}
			break
		}
	}
	slices.Sort(gaps)
	return gaps
}
