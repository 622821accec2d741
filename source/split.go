package source

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
)

// Large change events.
//
// MongoDB fails a change stream whose next event is over 16 MiB + 16 KiB
// with BSONObjectTooLarge (10334) on the getMore (or aggregate) that would
// return it, abandoning the whole batch (plan_executor_pipeline.cpp
// _trySerializeToBson; getmore_cmd.cpp). MongoDB 7.0 and 6.0.9 offer the
// $changeStreamSplitLargeEvent stage, which instead returns such an event as
// fragments {_id: <token>, splitEvent: {fragment: i, of: n}, fields...}, in
// order, each with its own resume token; resuming after fragment i continues
// with fragment i+1 (document_source_change_stream_split_large_event.cpp,
// jstests/change_streams/split_large_event.js).
//
// Reassembly. The fragments of one event are collected here and handed on
// as one event only when the last one is read: a fragment is never routed
// on its own. The whole event takes the _id (resume token) of its last
// fragment, so its id and checkpoint position are those of the last
// fragment: resuming after that token continues with the next change, while
// resuming after any earlier fragment would re-deliver only the rest of the
// event. While fragments are buffered nothing of the event is in the tracker
// and the post-batch token is not taken as a resume point, so the persisted
// checkpoint stays at the change before the event; a crash or a reopen
// between fragments re-reads every fragment from the first. The id is
// stable across re-deliveries because the split is deterministic for a
// given pipeline (MongoDB itself relies on that to resume from a fragment).

// Policies of Spec.SplitLargeEvents and Spec.OnOversizeEvent.
const (
	SplitAuto    = "auto"
	SplitOff     = "off"
	OversizeFail = "fail"
	OversizeSkip = "skip"
)

// ErrOversizeEvent is wrapped by the error of a source stopped by a change
// event MongoDB could not return (on_oversize_event = "fail").
var ErrOversizeEvent = errors.New("change event too large")

const splitStage = "$changeStreamSplitLargeEvent"

// codeBSONObjectTooLarge is MongoDB's BSONObjectTooLarge.
const codeBSONObjectTooLarge = 10334

// fragments collects the fragments of one split event.
type fragments struct {
	of    int32
	parts []bson.Raw
}

// pending reports whether fragments of an event are waiting for the rest.
func (f *fragments) pending() bool { return len(f.parts) > 0 }

func (f *fragments) reset() { f.of, f.parts = 0, nil }

// add takes one change read from the stream. It returns the change to hand
// on: raw itself when it is not a fragment, the reassembled event after the
// last fragment, or nil while fragments are missing. A fragment out of
// order is an error (the stream then reopens from the last whole event).
func (f *fragments) add(raw bson.Raw) (bson.Raw, error) {
	var sv bson.RawValue
	err := errNoSplitEvent
	if hasSplitEvent(raw) {
		sv, err = raw.LookupErr("splitEvent")
	}
	if err != nil {
		if f.pending() {
			f.reset()
			return nil, errors.New("split event: a change arrived before the last fragment of the previous event")
		}
		return raw, nil
	}
	sd, ok := sv.DocumentOK()
	if !ok {
		return nil, errors.New("split event: splitEvent is not a document")
	}
	frag, ok1 := sd.Lookup("fragment").AsInt64OK()
	of, ok2 := sd.Lookup("of").AsInt64OK()
	if !ok1 || !ok2 || of < 1 || frag < 1 || frag > of {
		return nil, fmt.Errorf("split event: invalid splitEvent %s", sd)
	}
	want := int64(len(f.parts)) + 1
	if frag != want || (f.pending() && int32(of) != f.of) {
		got := len(f.parts)
		f.reset()
		return nil, fmt.Errorf("split event: fragment %d of %d arrived after %d fragments", frag, of, got)
	}
	f.of = int32(of)
	f.parts = append(f.parts, raw)
	if frag < of {
		return nil, nil
	}
	whole, err := merge(f.parts)
	f.reset()
	return whole, err
}

var errNoSplitEvent = errors.New("no splitEvent")

// splitEventElem is how a top-level splitEvent element begins after its
// type byte: the key and its terminating NUL.
const splitEventElem = "splitEvent\x00"

// hasSplitEvent reports whether raw has a top-level splitEvent field that
// raw.LookupErr("splitEvent") finds (it walks the elements as LookupErr
// does, up to the first malformed one), comparing each key in place
// instead of searching for its end again: most changes are not fragments.
func hasSplitEvent(raw bson.Raw) bool {
	length, rem, ok := bsoncore.ReadLength(raw)
	if !ok {
		return false
	}
	length -= 4
	for length > 1 {
		el, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return false
		}
		length -= int32(len(el))
		rem = rest
		// el is the type byte, the key up to its NUL, then the value: the
		// key is "splitEvent" exactly when this NUL ends it.
		if len(el) > len(splitEventElem) && string(el[1:1+len(splitEventElem)]) == splitEventElem {
			return true
		}
	}
	return false
}

// merge reassembles an event from its fragments: the last fragment's _id,
// then every field of every fragment but _id and splitEvent, in fragment
// order. A field in two fragments is an error.
func merge(parts []bson.Raw) (bson.Raw, error) {
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	last := parts[len(parts)-1]
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, size))
	id := last.Lookup("_id")
	dst = bsoncore.AppendHeader(dst, bsoncore.Type(id.Type), "_id")
	dst = append(dst, id.Value...)
	seen := map[string]bool{"_id": true, "splitEvent": true}
	for _, p := range parts {
		elems, err := p.Elements()
		if err != nil {
			return nil, fmt.Errorf("split event: fragment: %w", err)
		}
		for _, e := range elems {
			k := e.Key()
			if k == "_id" || k == "splitEvent" {
				continue
			}
			if seen[k] {
				return nil, fmt.Errorf("split event: field %q in two fragments", k)
			}
			seen[k] = true
			dst = append(dst, e...)
		}
	}
	dst, err := bsoncore.AppendDocumentEnd(dst, idx)
	if err != nil {
		return nil, err
	}
	return bson.Raw(dst), nil
}

// splitSupported reports whether the server has $changeStreamSplitLargeEvent:
// MongoDB 7.0 and later, and 6.0.9 and later 6.0 releases ("New in MongoDB
// 7.0 (and 6.0.9)", the stage's reference page). The rapid releases 6.1 to
// 6.3 do not have it.
func splitSupported(version string) bool {
	var v [3]int
	for i, p := range strings.SplitN(version, ".", 3) {
		p, _, _ = strings.Cut(p, "-")
		n, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		v[i] = n
	}
	return v[0] >= 7 || v[0] == 6 && v[1] == 0 && v[2] >= 9
}

// serverVersion asks the server for its version (buildInfo).
func serverVersion(ctx context.Context, client *mongo.Client) (string, error) {
	var bi struct {
		Version string `bson:"version"`
	}
	if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&bi); err != nil {
		return "", fmt.Errorf("buildInfo: %w", err)
	}
	return bi.Version, nil
}

// splitPipeline appends the split stage to pipeline when the source wants
// it and the server has it, unless the configured pipeline already ends
// with it.
func (s *Source) splitPipeline(ctx context.Context, pipeline bson.A) (bson.A, error) {
	if s.spec.SplitLargeEvents == SplitOff || endsWithSplit(pipeline) {
		return pipeline, nil
	}
	s.mu.Lock()
	known, ok := s.splitKnown, s.splitOK
	s.mu.Unlock()
	if !known {
		v, err := serverVersion(ctx, s.client)
		if err != nil {
			return nil, err
		}
		ok = splitSupported(v)
		s.mu.Lock()
		s.splitKnown, s.splitOK = true, ok
		s.mu.Unlock()
		if ok {
			s.log.Info("large change events are split by the server and reassembled", "server_version", v)
		} else {
			s.log.Info("the server cannot split large change events; an event over 16 MB follows on_oversize_event", "server_version", v, "on_oversize_event", s.spec.OnOversizeEvent)
		}
	}
	if !ok {
		return pipeline, nil
	}
	return append(pipeline, bson.D{{Key: splitStage, Value: bson.D{}}}), nil
}

func endsWithSplit(p bson.A) bool {
	if len(p) == 0 {
		return false
	}
	d, ok := p[len(p)-1].(bson.D)
	return ok && len(d) == 1 && d[0].Key == splitStage
}

// isTooLarge reports whether err is MongoDB's BSONObjectTooLarge.
func isTooLarge(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCode(codeBSONObjectTooLarge)
}

// tooLargeToken finds the resume token of the change MongoDB could not
// return in its BSONObjectTooLarge message. The server builds that message
// from the document being serialized, ending with "First element: " and its
// first element, and a change event's first element is its _id, the resume
// token: `... First element: _id: { _data: "8265..." }`.
var tooLargeToken = regexp.MustCompile(`First element: _id: \{ _data: "([0-9A-Fa-f]+)" \}`)

// oversizePosition returns the resume token and cluster time of the change
// named by a BSONObjectTooLarge error.
func oversizePosition(err error) (bson.Raw, bson.Timestamp, bool) {
	m := tooLargeToken.FindStringSubmatch(err.Error())
	if m == nil {
		return nil, bson.Timestamp{}, false
	}
	tok, merr := bson.Marshal(bson.D{{Key: "_data", Value: m[1]}})
	if merr != nil {
		return nil, bson.Timestamp{}, false
	}
	ct, _ := event.TokenClusterTime(tok)
	return tok, ct, true
}

// recordOversize writes the gap dead letter of a change skipped because it
// was too large: its resume token and cluster time. The gap's _id is
// derived from the token, so writing it again (after a crash) is an upsert.
func (s *Source) recordOversize(ctx context.Context, tok bson.Raw, ct bson.Timestamp, cause error) error {
	now := time.Now().UTC()
	at := time.Unix(int64(ct.T), 0).UTC()
	e := deadletter.Entry{
		ID:        "gap/" + s.spec.Name + "/oversize/" + event.TokenData(tok),
		Kind:      deadletter.KindGap,
		Source:    s.spec.Name,
		Reason:    "oversize_event",
		LastError: cause.Error(), FirstError: cause.Error(),
		ClusterTime: ct,
		GapFrom:     at, GapTo: at, LastToken: tok,
		CreatedAt: now, FirstFailedAt: now, LastFailedAt: now,
	}
	if err := s.gaps.Put(ctx, e); err != nil {
		return err
	}
	s.mOversize.Inc()
	s.log.Error("skipped a change event too large for MongoDB to return; the gap is recorded in the dead-letter collection",
		"resume_token", event.TokenData(tok), "cluster_time", ct.T, "gap_id", e.ID)
	return nil
}
