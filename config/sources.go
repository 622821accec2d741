package config

import (
	"math"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

var (
	fullDocumentModes             = []string{FullDocumentDefault, FullDocumentUpdateLookup, FullDocumentWhenAvailable, FullDocumentRequired}
	fullDocumentBeforeChangeModes = []string{FullDocumentBeforeChangeOff, FullDocumentBeforeChangeWhenAvailable, FullDocumentBeforeChangeRequired}
	historyLostModes              = []string{string(HistoryLostFail), string(HistoryLostResumeFromNow)}
	splitLargeEventsModes         = []string{SplitLargeEventsAuto, SplitLargeEventsOff}
	oversizeEventModes            = []string{OversizeEventFail, OversizeEventSkip}
	snapshotModes                 = []string{SnapshotNever, SnapshotInitial}
	// changeStreamStages are the aggregation stages MongoDB allows in a
	// change stream pipeline.
	changeStreamStages = []string{"$addFields", "$match", "$project", "$replaceRoot", "$replaceWith", "$redact", "$set", "$unset", "$changeStreamSplitLargeEvent"}
)

// source decodes one [[sources]] entry; nameVal is nil when the name is
// missing or invalid. stateDB is mongo.state_database: a database-level
// source of it is refused (its checkpoint saves and dead letters would
// become events); a collection of it may be watched on purpose (the
// dead-letter collection, to act on dead letters).
func (d *decoder) source(o *obj, stateDB string) (s Source, nameVal *value) {
	s.Name, nameVal = o.name()
	if db, v, ok := o.str("database"); v != nil && ok {
		if db == "" {
			d.errorf(o.keyPath("database"), v.line, "must not be empty (omit it to watch the whole cluster)")
		} else if msg := checkDBName(db); msg != "" {
			d.errorf(o.keyPath("database"), v.line, "%s", msg)
		} else if db == stateDB && o.t.get("collection") == nil {
			d.errorf(o.keyPath("database"), v.line, "%q is changegate's own state database (mongo.state_database): its checkpoint saves and dead letters would become events of this source; watch another database, set mongo.state_database to one no source watches, or name one collection of it (collection = \"deadletters\") to watch dead letters on purpose", db)
		} else {
			s.Database = db
		}
	}
	if coll, v, ok := o.str("collection"); v != nil && ok {
		if msg := checkCollName(coll); msg != "" {
			d.errorf(o.keyPath("collection"), v.line, "%s", msg)
		} else if o.t.get("database") == nil {
			d.errorf(o.keyPath("collection"), v.line, "requires database (a collection is watched within a database)")
		} else {
			s.Collection = coll
		}
	}
	s.FullDocument = o.enum("full_document", FullDocumentDefault, fullDocumentModes)
	s.FullDocumentBeforeChange = o.enum("full_document_before_change", FullDocumentBeforeChangeOff, fullDocumentBeforeChangeModes)
	if p, v, ok := o.str("pipeline"); v != nil && ok {
		s.Pipeline = d.pipeline(o.keyPath("pipeline"), v.line, p)
	}
	s.StartAt = o.startAt("start_at")
	s.OnHistoryLost = OnHistoryLost(o.enum("on_history_lost", string(HistoryLostFail), historyLostModes))
	s.SplitLargeEvents = o.enum("split_large_events", SplitLargeEventsAuto, splitLargeEventsModes)
	s.OnOversizeEvent = o.enum("on_oversize_event", OversizeEventFail, oversizeEventModes)
	s.BatchSize = int32(o.integer("batch_size", 0, 0, math.MaxInt32))
	s.MaxAwait, _ = o.duration("max_await", DefaultMaxAwait, 0)
	s.MaxInFlightEvents = int(o.integer("max_in_flight_events", DefaultMaxInFlightEvents, 1, math.MaxInt32))
	s.CheckpointInterval, _ = o.duration("checkpoint_interval", DefaultCheckpointInterval, time.Millisecond)
	s.Partitions = int(o.integer("partitions", 1, 1, MaxPartitions))
	s.Snapshot = o.enum("snapshot", SnapshotNever, snapshotModes)
	if v := o.lookup("snapshot"); v != nil && s.Snapshot == SnapshotInitial && !s.StartAt.IsZero() {
		d.errorf(o.keyPath("snapshot"), v.line, `"initial" cannot be combined with start_at: a snapshot continues with the stream from the position it takes before the scan`)
	}
	o.done()
	return s, nameVal
}

// startAt accepts an RFC 3339 string or a TOML offset date-time.
func (o *obj) startAt(k string) time.Time {
	v := o.lookup(k)
	if v == nil {
		return time.Time{}
	}
	switch v.kind {
	case kindDateTime:
		return v.t
	case kindLocalDateTime, kindLocalDate:
		o.d.errorf(o.keyPath(k), v.line, "needs a time zone offset, e.g. 2026-11-22T10:00:00Z, got %s", v.typeName())
	case kindString:
		s, ok := o.d.expand(o.keyPath(k), v.line, v.str)
		if !ok {
			return time.Time{}
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			o.d.errorf(o.keyPath(k), v.line, `invalid time %q: want RFC 3339 with a time zone offset, e.g. "2026-11-22T10:00:00Z"`, s)
			return time.Time{}
		}
		return t
	default:
		o.typeError(k, v, `an RFC 3339 date-time like "2026-11-22T10:00:00Z"`)
	}
	return time.Time{}
}

// pipeline parses extra change stream stages written as an Extended JSON
// array; nil when invalid (reported).
func (d *decoder) pipeline(path string, line int, s string) []bson.D {
	if strings.TrimSpace(s) == "" {
		d.errorf(path, line, `must be a JSON array of stages, e.g. '[{"$match": {...}}]'`)
		return nil
	}
	var arr bson.A
	if err := bson.UnmarshalExtJSON([]byte(s), false, &arr); err != nil {
		d.errorf(path, line, "invalid Extended JSON array of stages: %v", err)
		return nil
	}
	stages := make([]bson.D, 0, len(arr))
	ok := true
	for i, e := range arr {
		stage, isDoc := e.(bson.D)
		switch {
		case !isDoc:
			d.errorf(path, line, "stage %d: must be a document", i)
			ok = false
		case len(stage) != 1:
			d.errorf(path, line, "stage %d: must have exactly one field, the stage name", i)
			ok = false
		case !slices.Contains(changeStreamStages, stage[0].Key):
			d.errorf(path, line, "stage %d: %s is not allowed in a change stream%s; allowed stages: %s",
				i, stage[0].Key, didYouMean(stage[0].Key, changeStreamStages), strings.Join(changeStreamStages, ", "))
			ok = false
		}
		stages = append(stages, stage)
	}
	// MongoDB requires $changeStreamSplitLargeEvent to be the last stage
	// (error 7182802), which allows it once, with an empty spec (7182800;
	// document_source_change_stream_split_large_event.cpp).
	wellFormed := ok
	for i, st := range stages {
		if !wellFormed || st[0].Key != splitLargeEventStage {
			continue
		}
		if i != len(stages)-1 {
			d.errorf(path, line, "stage %d: %s must be the last stage of the pipeline (MongoDB refuses it anywhere else)", i, splitLargeEventStage)
			ok = false
		}
		if spec, isDoc := st[0].Value.(bson.D); !isDoc || len(spec) != 0 {
			d.errorf(path, line, "stage %d: %s takes an empty document, {}", i, splitLargeEventStage)
			ok = false
		}
	}
	if !ok {
		return nil
	}
	return stages
}
