package mongowire

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

type streamScope uint8

const (
	scopeCollection streamScope = iota
	scopeDatabase
	scopeCluster
)

// streamStage is one pipeline stage after $changeStream.
type streamStage struct {
	match   matcher  // $match
	project bson.Raw // $project (aggregation projection) / $unset as a projection
	// doc is an $addFields/$set/$replaceRoot/$replaceWith stage.
	doc bson.RawElement
	// redact is the expression of a $redact stage.
	redact bson.RawValue
}

// streamCursor is a change stream's server-side state.
type streamCursor struct {
	mu       sync.Mutex
	ns       string // cursor namespace reported to the client
	scope    streamScope
	db, coll string

	fullDocument string // "default", "updateLookup", "whenAvailable", "required"
	beforeChange string // "off", "whenAvailable", "required"
	stages       []streamStage

	pos     uint64         // seq of the last oplog entry processed
	posTS   bson.Timestamp // cluster time of that position (for tokens)
	posIdx  uint32         // txnOpIndex of that position (for tokens)
	startTS bson.Timestamp // entries before this time are skipped
	// pendingInvalidate: the entry at pos invalidated the stream and the
	// invalidate event is still to be returned.
	pendingInvalidate bool
	// lastEvent is the token of the last returned event if nothing was
	// scanned after it, so the post-batch token equals that event's _id.
	lastEvent *resumeToken
	closed    bool

	// split: the pipeline ends with $changeStreamSplitLargeEvent (split.go).
	split bool
	// parts are fragments of a split event still to be returned.
	parts []eventPart
	// resumeFrag is the fragment number + 1 of the resume token when the
	// stream resumed from a fragment of the event of entry resumeSeq.
	resumeFrag uint32
	resumeSeq  uint64

	// killed is closed by killCursors: it interrupts a getMore waiting for
	// events, which then fails with CursorKilled like on the server.
	killed   chan struct{}
	killOnce sync.Once
}

// kill interrupts a waiting getMore; the cursor is already unregistered.
func (c *streamCursor) kill() {
	c.killOnce.Do(func() { close(c.killed) })
}

func (c *streamCursor) namespace() string { return c.ns }

func (c *streamCursor) defaultShape() bool {
	return (c.fullDocument == "default" || c.fullDocument == "") && c.beforeChange == "off"
}

// relevant reports whether entry e belongs to this stream, and whether it
// invalidates the stream.
func (c *streamCursor) relevant(e *oplogEntry) (match, invalidates bool) {
	switch c.scope {
	case scopeCollection:
		if e.db != c.db || e.coll != c.coll || e.op == opDropDatabase {
			return false, false
		}
		return true, e.op == opDrop || e.op == opRename
	case scopeDatabase:
		if e.db != c.db || strings.HasPrefix(e.coll, "system.") {
			return false, false
		}
		return true, e.op == opDropDatabase
	default:
		switch e.db {
		case "admin", "config", "local":
			return false, false
		}
		return !strings.HasPrefix(e.coll, "system."), false
	}
}

// knownStages are aggregation stages MongoDB knows but does not allow after
// $changeStream (others are unrecognized, error 40324).
var knownStages = map[string]bool{"$group": true, "$sort": true, "$limit": true, "$skip": true, "$count": true,
	"$lookup": true, "$graphLookup": true, "$unwind": true, "$out": true, "$merge": true, "$facet": true,
	"$bucket": true, "$bucketAuto": true, "$sortByCount": true, "$sample": true, "$geoNear": true,
	"$unionWith": true, "$densify": true, "$fill": true, "$setWindowFields": true, "$documents": true,
	"$indexStats": true, "$collStats": true, "$currentOp": true, "$listSessions": true, "$changeStream": true}

var changeStreamOptions = map[string]bool{
	"fullDocument": true, "fullDocumentBeforeChange": true, "resumeAfter": true, "startAfter": true,
	"startAtOperationTime": true, "showExpandedEvents": true, "allChangesForCluster": true,
	"allowToRunOnConfigDB": true, "allowToRunOnSystemNS": true, "showMigrationEvents": true,
	"showSystemEvents": true, "showRawUpdateDescription": true,
}

func (s *Server) openChangeStream(cmd *command, dst []byte, stages []bson.Raw) ([]byte, error) {
	spec, ok := stages[0].Index(0).Value().DocumentOK()
	if !ok {
		return nil, cmdErr(50808, "$changeStream stage expects a document as argument")
	}
	c := &streamCursor{db: cmd.db, fullDocument: "default", beforeChange: "off", killed: make(chan struct{})}
	target := cmd.body.Lookup("aggregate")
	allCluster, _ := spec.Lookup("allChangesForCluster").BooleanOK()
	switch {
	case target.Type == bson.TypeString:
		c.scope, c.coll = scopeCollection, target.StringValue()
		if !validCollName(c.coll) {
			return nil, cmdErr(codeInvalidNamespace, "Invalid namespace specified '%s.%s'", cmd.db, c.coll)
		}
		c.ns = cmd.db + "." + c.coll
	case target.IsNumber() && num(target) == 1:
		c.ns = cmd.db + ".$cmd.aggregate"
		switch {
		case cmd.db == "admin" && allCluster:
			c.scope = scopeCluster
		case cmd.db == "admin":
			return nil, cmdErr(codeInvalidNamespace, "$changeStream may not be opened on the internal admin database")
		case allCluster:
			return nil, cmdErr(codeInvalidOptions, "$changeStream must be run against the 'admin' database with {aggregate: 1} if 'allChangesForCluster' is true")
		default:
			c.scope = scopeDatabase
		}
	default:
		return nil, cmdErr(codeFailedToParse, "Invalid aggregate target %v", target)
	}
	if c.scope != scopeCluster && (cmd.db == "admin" || cmd.db == "config" || cmd.db == "local") {
		return nil, cmdErr(codeInvalidNamespace, "$changeStream may not be opened on the internal %s database", cmd.db)
	}
	elems, _ := spec.Elements()
	nResume := 0
	for _, e := range elems {
		if !changeStreamOptions[e.Key()] {
			return nil, cmdErr(40415, "BSON field '$changeStream.%s' is an unknown field.", e.Key())
		}
		switch e.Key() {
		case "resumeAfter", "startAfter", "startAtOperationTime":
			nResume++
		}
	}
	if nResume > 1 {
		return nil, cmdErr(40674, "Only one type of resume option is allowed, but multiple were found.")
	}
	if v, ok := spec.Lookup("fullDocument").StringValueOK(); ok {
		switch v {
		case "default", "updateLookup", "whenAvailable", "required":
			c.fullDocument = v
		default:
			return nil, cmdErr(codeBadValue, "Enumeration value '%s' for field '$changeStream.fullDocument' is not a valid value.", v)
		}
	}
	if v, ok := spec.Lookup("fullDocumentBeforeChange").StringValueOK(); ok {
		switch v {
		case "off", "whenAvailable", "required":
			c.beforeChange = v
		default:
			return nil, cmdErr(codeBadValue, "Enumeration value '%s' for field '$changeStream.fullDocumentBeforeChange' is not a valid value.", v)
		}
	}
	for i, st := range stages[1:] {
		e := st.Index(0)
		switch e.Key() {
		case splitStage:
			if err := parseSplitStage(e, i, len(stages)-1); err != nil {
				return nil, err
			}
			c.split = true
		case "$match":
			f, ok := e.Value().DocumentOK()
			if !ok {
				return nil, cmdErr(15959, "the match filter must be an expression in an object")
			}
			m, err := compileFilter(f)
			if err != nil {
				return nil, filterErr(err)
			}
			c.stages = append(c.stages, streamStage{match: m})
		case "$project":
			p, ok := e.Value().DocumentOK()
			if !ok {
				return nil, cmdErr(15969, "$project specification must be an object")
			}
			c.stages = append(c.stages, streamStage{project: p})
		case "$unset":
			b := bsoncore.NewDocumentBuilder()
			if s, ok := e.Value().StringValueOK(); ok {
				b.AppendInt32(s, 0)
			} else if arr, ok := e.Value().ArrayOK(); ok {
				vals, _ := arr.Values()
				for _, v := range vals {
					b.AppendInt32(v.StringValue(), 0)
				}
			}
			c.stages = append(c.stages, streamStage{project: bson.Raw(b.Build())})
		case "$addFields", "$set", "$replaceRoot", "$replaceWith":
			c.stages = append(c.stages, streamStage{doc: e})
		case "$redact":
			c.stages = append(c.stages, streamStage{redact: e.Value()})
		default:
			// The stages MongoDB allows after $changeStream
			// (change_stream_filter_helpers / DocumentSourceChangeStream
			// ::checkValueType: $match, $project, $addFields/$set, $unset,
			// $replaceRoot/$replaceWith, $redact, $changeStreamSplitLargeEvent).
			if !knownStages[e.Key()] {
				return nil, cmdErr(codeLocation40324, "Unrecognized pipeline stage name: '%s'", e.Key())
			}
			return nil, cmdErr(codeIllegalOperation, "%s is not permitted in a $changeStream pipeline", e.Key())
		}
	}
	batchSize := 101
	if cur, ok := cmd.body.Lookup("cursor").DocumentOK(); ok {
		if v, err := cur.LookupErr("batchSize"); err == nil {
			batchSize = int(num(v))
			if batchSize == 0 {
				batchSize = noEvents // an empty first batch, as on the server
			}
		}
	} else {
		return nil, cmdErr(codeFailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument")
	}

	d := s.data
	d.mu.Lock()
	opTime := d.clock
	o := &d.oplog
	switch {
	case spec.Lookup("resumeAfter").Type != 0 || spec.Lookup("startAfter").Type != 0:
		key := "resumeAfter"
		if spec.Lookup("startAfter").Type != 0 {
			key = "startAfter"
		}
		tdoc, ok := spec.Lookup(key).DocumentOK()
		tok, ok2 := decodeToken(tdoc)
		if !ok || !ok2 {
			d.mu.Unlock()
			return nil, cmdErr(codeInvalidResumeToken, "Bad resume token: _data of missing or of wrong type. Expected string, got %s", tdoc)
		}
		if _, isFrag := tok.fragment(); isFrag && !c.split {
			d.mu.Unlock()
			return nil, cmdErr(codeChangeStreamFatalError, "To resume from a split event, the $changeStream pipeline must include a $changeStreamSplitLargeEvent stage")
		}
		if tok.kind == tokInvalidate && key == "resumeAfter" {
			d.mu.Unlock()
			return nil, cmdErr(codeInvalidResumeToken, "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.")
		}
		if tok.seq > o.lastSeq() {
			d.mu.Unlock()
			return nil, cmdErr(codeChangeStreamFatalError, "cannot resume stream; the resume token was not found. %s", tdoc)
		}
		if tsLess(tok.ts, o.lostBefore) || tok.seq+1 < o.firstSeq() {
			d.mu.Unlock()
			return nil, cmdErr(codeChangeStreamHistory, "Resume of change stream was not possible, as the resume point may no longer be in the oplog.")
		}
		c.pos, c.posTS, c.posIdx = tok.seq, tok.ts, tok.txnOpIndex
		if _, isFrag := tok.fragment(); isFrag {
			// Re-read the event and continue after the fragment (split.go).
			c.pos, c.resumeFrag, c.resumeSeq = tok.seq-1, tok.frag, tok.seq
			t := tok
			c.lastEvent = &t
		} else if tok.kind == tokEvent {
			if e := o.get(tok.seq); e != nil {
				if _, inv := c.relevant(e); inv {
					c.pendingInvalidate = true
				}
			}
		}
	case spec.Lookup("startAtOperationTime").Type != 0:
		t, i, ok := spec.Lookup("startAtOperationTime").TimestampOK()
		if !ok {
			d.mu.Unlock()
			return nil, cmdErr(codeTypeMismatch, "BSON field '$changeStream.startAtOperationTime' is the wrong type, expected type 'timestamp'")
		}
		start := bson.Timestamp{T: t, I: i}
		if tsLess(start, o.lostBefore) {
			d.mu.Unlock()
			return nil, cmdErr(codeChangeStreamHistory, "Resume of change stream was not possible, as the resume point may no longer be in the oplog.")
		}
		c.pos = o.lastSeq()
		for j, e := range o.entries {
			if !tsLess(e.ts, start) {
				c.pos = o.entries[j].seq - 1
				break
			}
		}
		c.posTS, c.startTS = start, start
	default:
		// Start after everything so far; reserve a cluster time so that
		// resuming from this operationTime excludes earlier writes.
		c.pos = o.lastSeq()
		c.posTS = d.tick()
		c.startTS = c.posTS
		opTime = c.posTS
	}
	d.mu.Unlock()

	id := s.registerCursor(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	d.mu.RLock()
	out, n, err := s.appendStreamReply(dst, "firstBatch", id, c, batchSize, opTime)
	d.mu.RUnlock()
	_ = n
	if err != nil {
		s.dropCursor(id)
		return nil, err
	}
	if c.closed {
		s.dropCursor(id)
	}
	return out, nil
}

// streamGetMore serves a getMore on a change stream: it returns as soon as
// events are available, or after maxWait with an empty batch and an advanced
// post-batch resume token.
func (s *Server) streamGetMore(cmd *command, dst []byte, id int64, c *streamCursor, batchSize int, maxWait time.Duration) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, cmdErr(codeCursorNotFound, "cursor id %d not found", id)
	}
	if err := s.waitFragmentHold(cmd, id, c); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(maxWait)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	d := s.data
	for {
		d.mu.RLock()
		out, n, err := s.appendStreamReply(dst, "nextBatch", id, c, batchSize, d.clock)
		notify := d.notify
		d.mu.RUnlock()
		if err != nil {
			s.dropCursor(id)
			return nil, err
		}
		if c.closed {
			s.dropCursor(id)
		}
		wait := time.Until(deadline)
		if n > 0 || c.closed || wait <= 0 {
			return out, nil
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-notify:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
			deadline = time.Now() // reply with what we have
		case <-c.killed:
			return nil, cmdErr(codeCursorKilled, "cursor id %d was killed by killCursors while a getMore was waiting", id)
		case <-cmd.ctx.Done():
			return nil, cmdErr(11600, "connection closed")
		}
	}
}

// appendStreamReply appends a cursor reply with the next batch of events.
// The caller holds c.mu and data.mu (shared).
func (s *Server) appendStreamReply(dst []byte, batchKey string, id int64, c *streamCursor, batchSize int, opTime bson.Timestamp) ([]byte, int, error) {
	// Size the reply once for the pending events rather than growing it
	// (large appends trigger copying and GC assists).
	if pending := s.data.oplog.next - 1 - c.pos; pending > 0 {
		want := int(min(pending, maxScan)) * 256
		if batchSize > 0 {
			want = min(want, batchSize*256)
		}
		dst = slices.Grow(dst, min(want, maxBatchBytes+64*1024))
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	cidx, dst := bsoncore.AppendDocumentElementStart(dst, "cursor")
	aidx, dst := bsoncore.AppendArrayElementStart(dst, batchKey)
	dst, n, pbrt, err := s.scanEvents(dst, c, batchSize, batchKey == "nextBatch")
	if err != nil {
		return nil, 0, err
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	dst = appendToken(dst, "postBatchResumeToken", pbrt)
	if c.closed {
		id = 0
	}
	dst = bsoncore.AppendInt64Element(dst, "id", id)
	dst = bsoncore.AppendStringElement(dst, "ns", c.ns)
	dst, _ = bsoncore.AppendDocumentEnd(dst, cidx)
	return s.appendOKAt(dst, idx, opTime), n, nil
}

// maxScan bounds the oplog entries examined per scan so one filtered stream
// cannot hold the data lock for long.
const maxScan = 1 << 18

// noEvents is the batch size of an aggregate with cursor {batchSize: 0}.
const noEvents = math.MinInt

// scanEvents appends up to batchSize events (<= 0: no count limit; noEvents: none)
// after the cursor position as array elements and advances the cursor. It
// returns the post-batch resume token.
func (s *Server) scanEvents(dst []byte, c *streamCursor, batchSize int, getMore bool) ([]byte, int, resumeToken, error) {
	o := &s.data.oplog
	n := 0
	budget := maxBatchBytes
	full := func() bool { return batchSize == noEvents || batchSize > 0 && n >= batchSize }
	// emitParts returns the pending fragments of a split event that fit;
	// false when some are left for the next batch.
	emitParts := func() bool {
		for len(c.parts) > 0 {
			p := c.parts[0]
			if full() || n > 0 && len(p.doc)+len(arrayKey(n))+2 > budget {
				return false
			}
			budget -= len(p.doc) + len(arrayKey(n)) + 2
			dst = bsoncore.AppendDocumentElement(dst, arrayKey(n), p.doc)
			n++
			t := p.tok
			c.lastEvent = &t
			c.parts = c.parts[1:]
		}
		c.parts = nil
		return true
	}
	if !emitParts() {
		return dst, n, c.positionToken(), nil
	}
	emitInvalidate := func() {
		e := o.get(c.pos)
		tok := resumeToken{ts: c.posTS, seq: c.pos, kind: tokInvalidate}
		var wall int64
		if e != nil {
			tok.ts, wall = e.ts, e.wall
		}
		eidx, d := bsoncore.AppendDocumentElementStart(dst, arrayKey(n))
		d = appendToken(d, "_id", tok)
		d = bsoncore.AppendStringElement(d, "operationType", "invalidate")
		d = bsoncore.AppendTimestampElement(d, "clusterTime", tok.ts.T, tok.ts.I)
		d = bsoncore.AppendDateTimeElement(d, "wallTime", wall)
		dst, _ = bsoncore.AppendDocumentEnd(d, eidx)
		n++
		c.pendingInvalidate, c.closed = false, true
		c.lastEvent = &tok
	}
	if c.pendingInvalidate {
		if full() {
			return dst, n, c.positionToken(), nil
		}
		emitInvalidate()
		return dst, n, *c.lastEvent, nil
	}
	if c.closed {
		return dst, n, c.positionToken(), nil
	}
	if c.pos+1 < o.firstSeq() {
		return nil, 0, resumeToken{}, cmdErr(codeChangeStreamHistory, "Resume of change stream was not possible, as the resume point may no longer be in the oplog.")
	}
	scanned := 0
	for seq := c.pos + 1; seq < o.next && !full() && scanned < maxScan; seq++ {
		scanned++
		e := o.get(seq)
		match, invalidates := c.relevant(e)
		if !match || tsLess(e.ts, c.startTS) {
			c.pos, c.posTS, c.posIdx, c.lastEvent = seq, e.ts, e.txnOpIndex, nil
			continue
		}
		ev, err := s.eventFor(c, e)
		if err != nil {
			return nil, 0, resumeToken{}, err
		}
		if ev != nil {
			// An event too large to serialize fails the whole batch, even
			// after events already in it (split.go).
			parts, err := c.eventParts(ev, e.token(), getMore)
			if err != nil {
				return nil, 0, resumeToken{}, err
			}
			if n > 0 && len(parts) > 0 && len(parts[0].doc)+len(arrayKey(n))+2 > budget {
				break // batch full by size; resume here next time
			}
			c.parts = parts
			c.pos, c.posTS, c.posIdx = seq, e.ts, e.txnOpIndex
			if !emitParts() {
				break // the rest of a split event comes in the next batch
			}
		} else {
			c.lastEvent = nil
			c.pos, c.posTS, c.posIdx = seq, e.ts, e.txnOpIndex
		}
		if invalidates {
			c.pendingInvalidate = true
			if !full() {
				emitInvalidate()
			}
			break
		}
	}
	return dst, n, c.positionToken(), nil
}

// positionToken is the resume token for the cursor's current position.
func (c *streamCursor) positionToken() resumeToken {
	if c.lastEvent != nil {
		return *c.lastEvent
	}
	return resumeToken{ts: c.posTS, txnOpIndex: c.posIdx, seq: c.pos, kind: tokHighWater}
}

// eventFor builds the event for entry e as stream c sees it, after the
// stream's pipeline; nil when a $match filters it out.
func (s *Server) eventFor(c *streamCursor, e *oplogEntry) (bson.Raw, error) {
	var ev bson.Raw
	if c.defaultShape() {
		if p := e.event.Load(); p != nil {
			ev = *p
		} else {
			b, _ := s.buildEvent(nil, c, e)
			raw := []byte(b)
			e.event.Store(&raw)
			ev = b
		}
	} else {
		b, err := s.buildEvent(nil, c, e)
		if err != nil {
			return nil, err
		}
		ev = b
	}
	if len(c.stages) == 0 {
		return ev, nil
	}
	id := ev.Lookup("_id")
	now := s.data.nowFn()
	for _, st := range c.stages {
		var err error
		switch {
		case st.match != nil:
			if !st.match.Match(ev) {
				return nil, nil
			}
		case st.doc != nil:
			ev, err = applyDocStage(ev, st.doc, now)
		case st.redact.Type != 0:
			var keep bool
			if ev, keep, err = redact(ev, st.redact, now); err == nil && !keep {
				return nil, nil
			}
		default:
			ev, err = aggProject(ev, st.project, now)
		}
		if err != nil {
			return nil, err
		}
	}
	if nid := ev.Lookup("_id"); nid.Type != id.Type || !bytes.Equal(nid.Value, id.Value) {
		return nil, cmdErr(codeChangeStreamFatalError, "Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. Modifying the _id field of an event makes it impossible to resume the stream from that point. Only transformations that retain the unmodified _id field are allowed.")
	}
	return ev, nil
}

// buildEvent encodes the change event for e with c's options.
func (s *Server) buildEvent(dst []byte, c *streamCursor, e *oplogEntry) (bson.Raw, error) {
	if dst == nil {
		dst = make([]byte, 0, 200+len(e.db)+len(e.coll)+len(e.post)+len(e.docKey)+len(e.upd)+len(e.pre))
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	if e.lsid != nil {
		// As change_stream_event_transform.cpp: txnNumber and lsid come
		// first in the events of a transaction.
		dst = bsoncore.AppendInt64Element(dst, "txnNumber", e.txnNumber)
		dst = bsoncore.AppendDocumentElement(dst, "lsid", e.lsid)
	}
	dst = appendToken(dst, "_id", e.token())
	dst = bsoncore.AppendStringElement(dst, "operationType", e.op.String())
	dst = bsoncore.AppendTimestampElement(dst, "clusterTime", e.ts.T, e.ts.I)
	dst = bsoncore.AppendDateTimeElement(dst, "wallTime", e.wall)
	switch e.op {
	case opInsert, opReplace:
		dst = bsoncore.AppendDocumentElement(dst, "fullDocument", e.post)
	case opUpdate:
		switch c.fullDocument {
		case "updateLookup":
			var cur bson.Raw
			if coll := s.data.coll(e.db, e.coll); coll != nil {
				if k, _, ok := idKey(e.docKey); ok {
					if de := coll.byID[k]; de != nil {
						cur = de.doc
					}
				}
			}
			if cur != nil {
				dst = bsoncore.AppendDocumentElement(dst, "fullDocument", cur)
			} else {
				dst = bsoncore.AppendNullElement(dst, "fullDocument")
			}
		case "whenAvailable", "required":
			switch {
			case e.prePost:
				dst = bsoncore.AppendDocumentElement(dst, "fullDocument", e.post)
			case c.fullDocument == "required":
				return nil, cmdErr(codeNoMatchingDocument, "Change stream was configured to require a post-image for all update, delete and replace events, but the post-image was not available for event: %s", e.docKey)
			default:
				dst = bsoncore.AppendNullElement(dst, "fullDocument")
			}
		}
	}
	nidx, dst := bsoncore.AppendDocumentElementStart(dst, "ns")
	dst = bsoncore.AppendStringElement(dst, "db", e.db)
	if e.op != opDropDatabase {
		dst = bsoncore.AppendStringElement(dst, "coll", e.coll)
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, nidx)
	switch e.op {
	case opInsert, opUpdate, opReplace, opDelete:
		dst = bsoncore.AppendDocumentElement(dst, "documentKey", e.docKey)
	case opRename:
		tidx, d := bsoncore.AppendDocumentElementStart(dst, "to")
		d = bsoncore.AppendStringElement(d, "db", e.toDB)
		d = bsoncore.AppendStringElement(d, "coll", e.toColl)
		dst, _ = bsoncore.AppendDocumentEnd(d, tidx)
	}
	if e.op == opUpdate {
		dst = bsoncore.AppendDocumentElement(dst, "updateDescription", e.upd)
	}
	if c.beforeChange != "off" && (e.op == opUpdate || e.op == opReplace || e.op == opDelete) {
		switch {
		case e.prePost:
			dst = bsoncore.AppendDocumentElement(dst, "fullDocumentBeforeChange", e.pre)
		case c.beforeChange == "required":
			return nil, cmdErr(codeNoMatchingDocument, "Change stream was configured to require a pre-image for all update, delete and replace events, but the pre-image was not available for event: %s", e.docKey)
		default:
			dst = bsoncore.AppendNullElement(dst, "fullDocumentBeforeChange")
		}
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return bson.Raw(dst), nil
}
