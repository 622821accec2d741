package mongowire

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Large change events, as MongoDB 7.0 (and 6.0.9) treats them. Read in the
// mongodb/mongo sources:
//
//   - src/mongo/db/query/plan_executor_pipeline.cpp, _trySerializeToBson: a
//     change stream's event is serialized with Document::toBson(), whose size
//     check (BSONObjMaxInternalSize, 16 MiB + 16 KiB) throws
//     BSONObjectTooLarge (10334) with BSONObj's message "BSONObj size: N
//     (0xHEX) is invalid. Size must be between 0 and 16793600(16MB) First
//     element: _id: { _data: "..." }" — the first element of an event is its
//     _id, so the error names the event's resume token; the counter
//     changeStreams.largeEventsFailed is bumped.
//   - src/mongo/db/commands/getmore_cmd.cpp: an executor error during a
//     getMore abandons the whole batch (nextBatch->abandon()), adds the
//     context "Executor error during getMore" and deletes the cursor (the
//     cursorFreer guard). Events of the same batch before the large one are
//     therefore not returned either; the aggregate's first batch fails the
//     same way ("PlanExecutor error during aggregation"). 10334 is not a
//     resumable change stream error, so drivers surface it.
//   - jstests/change_streams/split_large_event.js and
//     large_events_failed_metric.js: with batchSize 0 the aggregate succeeds
//     and the getMore fails with BSONObjectTooLarge.
//   - src/mongo/db/pipeline/document_source_change_stream_split_large_event.cpp
//     and change_stream_split_event_helpers.cpp for $changeStreamSplitLargeEvent:
//     the spec must be {} (7182800); it must be the last stage and appear once
//     (7182802); outside a change stream it is IllegalOperation. An event
//     whose BSON is at most kBSONObjMaxChangeEventSize (16 MiB + 16 KiB - 8 KiB)
//     is returned unchanged; a larger one is split: every field but _id,
//     ordered by (BSON element size, name), is packed greedily into
//     fragments of at most kBSONObjMaxChangeEventSize minus the resume
//     token's size; each fragment is {_id: <token with fragmentNum>,
//     splitEvent: {fragment: i (1-based), of: n}, fields...}. A field that
//     does not fit alone fails with 7182500.
//   - Resuming from a fragment's token re-splits the event, skips the
//     fragments up to and including the token's (the skip in the split stage
//     plus DocumentSourceChangeStreamEnsureResumeTokenPresent swallowing the
//     resume point itself), so the stream continues with the next fragment
//     (split_large_event.js: "Resume the stream from the second-last fragment
//     and test that we see only the last fragment"). If the event is no
//     longer large enough to split, or splits into too few fragments, the
//     stream fails with ChangeStreamFatalError (280); resuming from a
//     fragment's token without the stage fails the aggregate with 280.
const (
	// maxInternalBSON is BSONObjMaxInternalSize: 16 MiB + 16 KiB.
	maxInternalBSON = maxBSONSize + 16*1024
	// maxChangeEventSize is kBSONObjMaxChangeEventSize.
	maxChangeEventSize = maxInternalBSON - 8*1024

	codeBSONObjectTooLarge = 10334
	splitStage             = "$changeStreamSplitLargeEvent"
)

// eventPart is one document a change stream returns for an oplog entry: the
// whole event or one fragment of it, with its resume token.
type eventPart struct {
	doc bson.Raw
	tok resumeToken
}

// tooLargeErr is the error the server reports for an event that cannot be
// serialized (see above).
func tooLargeErr(ev bson.Raw, getMore bool) *CommandError {
	first := "EOO"
	if e, err := ev.IndexErr(0); err == nil {
		first = e.Key() + ": " + shellValue(e.Value())
	}
	ctx := "PlanExecutor error during aggregation"
	if getMore {
		ctx = "Executor error during getMore"
	}
	return cmdErr(codeBSONObjectTooLarge, "%s :: caused by :: BSONObj size: %d (0x%X) is invalid. Size must be between 0 and %d(16MB) First element: %s",
		ctx, len(ev), len(ev), maxInternalBSON, first)
}

// shellValue formats a value as BSONElement::toString does for the simple
// types a resume token holds: { _data: "..." }.
func shellValue(v bson.RawValue) string {
	switch v.Type {
	case bson.TypeString:
		return fmt.Sprintf("%q", v.StringValue())
	case bson.TypeEmbeddedDocument:
		elems, _ := v.Document().Elements()
		parts := make([]string, len(elems))
		for i, e := range elems {
			parts[i] = e.Key() + ": " + shellValue(e.Value())
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	}
	return v.String()
}

// splitEvent splits ev (token tok) into fragments as the split stage does.
func splitEvent(ev bson.Raw, tok resumeToken) ([]eventPart, error) {
	type field struct {
		key  string
		size int
		raw  []byte // the whole element
	}
	elems, err := ev.Elements()
	if err != nil {
		return nil, cmdErr(codeInternalError, "split event: %v", err)
	}
	fields := make([]field, 0, len(elems))
	for _, e := range elems {
		if e.Key() == "_id" {
			continue
		}
		fields = append(fields, field{key: e.Key(), size: len(e), raw: e})
	}
	if len(fields) == 0 {
		return nil, cmdErr(7182502, "Cannot split an empty event or an event containing solely '_id' field")
	}
	slices.SortFunc(fields, func(a, b field) int {
		if a.size != b.size {
			return a.size - b.size
		}
		return strings.Compare(a.key, b.key)
	})
	tokSize := len(appendTokenDoc(nil, tok))
	maxFrag := maxChangeEventSize - tokSize
	var groups [][]field
	for i := 0; i < len(fields); {
		ftok := tok
		ftok.frag = uint32(len(groups)) + 1
		// _id, splitEvent and the sort key metadata the server counts.
		size := len(fragmentHead(nil, ftok, 1, 1)) + len(appendTokenDoc(nil, ftok))
		var g []field
		for {
			g = append(g, fields[i])
			size += fields[i].size
			i++
			if i == len(fields) || size+fields[i].size > maxFrag {
				break
			}
		}
		if size > maxFrag {
			return nil, cmdErr(7182500, "Splitting change event failed: fragment size %d is greater than maximum allowed fragment size %d", size, maxFrag)
		}
		groups = append(groups, g)
	}
	parts := make([]eventPart, len(groups))
	for n, g := range groups {
		ftok := tok
		ftok.frag = uint32(n) + 1
		d := fragmentHead(nil, ftok, n+1, len(groups))
		for _, f := range g {
			d = append(d, f.raw...)
		}
		d = append(d, 0)
		d = bsoncore.UpdateLength(d, 0, int32(len(d)))
		parts[n] = eventPart{doc: d, tok: ftok}
	}
	return parts, nil
}

// fragmentHead starts a fragment document: its length (to be updated), _id
// and splitEvent.
func fragmentHead(dst []byte, tok resumeToken, i, of int) []byte {
	_, dst = bsoncore.AppendDocumentStart(dst)
	dst = appendToken(dst, "_id", tok)
	sidx, dst := bsoncore.AppendDocumentElementStart(dst, "splitEvent")
	dst = bsoncore.AppendInt32Element(dst, "fragment", int32(i))
	dst = bsoncore.AppendInt32Element(dst, "of", int32(of))
	dst, _ = bsoncore.AppendDocumentEnd(dst, sidx)
	return dst
}

// appendTokenDoc appends the token document {_data: "..."}.
func appendTokenDoc(dst []byte, tok resumeToken) []byte {
	d := appendToken(nil, "x", tok)
	// d is: type byte, "x\x00", the document.
	return append(dst, d[3:]...)
}

// eventParts returns what stream c returns for the event ev of oplog entry
// seq: the event, its fragments, or an error, as described above.
func (c *streamCursor) eventParts(ev bson.Raw, tok resumeToken, getMore bool) ([]eventPart, error) {
	if c.resumeFrag > 0 && tok.seq == c.resumeSeq {
		// The resume point: a fragment of this event.
		skip := int(c.resumeFrag - 1)
		c.resumeFrag = 0
		if len(ev) <= maxChangeEventSize {
			return nil, cmdErr(codeChangeStreamFatalError, "Attempted to resume from a split event fragment, but the event in the resumed stream was not large enough to be split")
		}
		parts, err := splitEvent(ev, tok)
		if err != nil {
			return nil, err
		}
		if skip > 0 && skip >= len(parts) {
			return nil, cmdErr(codeChangeStreamFatalError, "Attempted to resume from a split event, but the resumed stream produced a different split. Ensure that the pipeline used to resume is the same as the original")
		}
		// The fragment with the resume token itself is swallowed too.
		return parts[skip+1:], nil
	}
	if c.split && len(ev) > maxChangeEventSize {
		return splitEvent(ev, tok)
	}
	if len(ev) > maxInternalBSON {
		return nil, tooLargeErr(ev, getMore)
	}
	return []eventPart{{doc: ev, tok: tok}}, nil
}

// parseSplitStage checks a $changeStreamSplitLargeEvent stage at index i of
// the stages after $changeStream (n of them).
func parseSplitStage(e bson.RawElement, i, n int) error {
	spec, ok := e.Value().DocumentOK()
	if !ok || !bytes.Equal(spec, emptyDoc) {
		return cmdErr(7182800, "$changeStreamSplitLargeEvent spec should be an empty object")
	}
	if i != n-1 {
		return cmdErr(7182802, "%s must be the last stage in the pipeline", splitStage)
	}
	return nil
}
