// Package mongowire is an in-process MongoDB server for tests: it speaks the
// MongoDB wire protocol over TCP (legacy OP_QUERY handshake answered with
// OP_REPLY, then OP_MSG) and behaves, for the real Go driver and other
// clients, like a one-node replica set running MongoDB 7.0 (wire version 21).
// Data lives in memory.
//
// Supported: hello/isMaster, ping, buildInfo, sessions (endSessions and the
// lsid/txnNumber fields), listDatabases, listCollections, create, collMod
// (changeStreamPreAndPostImages), drop, dropDatabase, renameCollection,
// createIndexes/listIndexes/dropIndexes (unique and sparse indexes are
// enforced, error 11000; a TTL index's expireAfterSeconds is checked and
// listed, but documents are not expired), insert, update (operators, replacement, update
// pipelines, upsert, multi), delete, find (filter, sort, projection, skip,
// limit, batchSize, singleBatch) and getMore, findAndModify, count,
// distinct, aggregate ($match $sort $skip $limit $project $unset $count,
// $group with expressions for _id and the accumulators, $addFields/$set $replaceRoot/$replaceWith), $expr in
// filters with the aggregation expressions listed in expr.go (among them
// $$NOW and $toHashedIndexKey),
// killCursors, configureFailPoint (failCommand with errorCode, errorLabels,
// closeConnection, blockConnection and writeConcernError, and
// failGetMoreAfterCursorCheckout), and multi-document transactions
// (startTransaction/autocommit: false, commitTransaction, abortTransaction,
// endSessions/killSessions/killAllSessions; txn.go), with the error labels
// the server attaches (TransientTransactionError, RetryableWriteError,
// ResumableChangeStreamError, NonResumableChangeStreamError). Filters come from
// package github.com/changegate/changegate/query, sorts, projections and
// updates from package mql beneath this one. Retryable writes are
// deduplicated on (lsid, txnNumber). Every reply carries operationTime and
// $clusterTime.
//
// Change streams ($changeStream first in an aggregate) work at collection,
// database and cluster level with resumeAfter, startAfter,
// startAtOperationTime, fullDocument (default, updateLookup,
// whenAvailable, required), fullDocumentBeforeChange, batchSize, awaiting
// getMores (maxTimeMS, default 1s), $match, $project (with computed
// fields), $addFields/$set, $unset, $replaceRoot/$replaceWith and $redact
// stages on the events (aggproject.go), post-batch resume tokens that advance past filtered events,
// invalidate on drop/rename/dropDatabase, events over 16 MiB + 16 KiB
// failing the batch with BSONObjectTooLarge (10334) and the
// $changeStreamSplitLargeEvent stage with resumable fragments (split.go),
// and bounded history
// (Options.OplogMaxEntries/OplogMaxAge, TruncateHistory, DiscardHistory):
// resuming from before the retained history fails with code 286.
// Resume tokens are {_data: "<hex>"} and sort by cluster time, then
// txnOpIndex.
//
// A transaction's writes are invisible to other readers and to change
// streams until it commits; then its changes appear at one cluster time,
// in order, with lsid and txnNumber, and resume tokens ordered by
// txnOpIndex. Isolation is snapshot isolation per collection (NOTES.md).
//
// Not supported: authentication, TLS, compression, $project in update pipelines,
// positional update operators, aggregation expressions beyond those of
// expr.go, idle-cursor timeouts, showExpandedEvents events and
// updateDescription.disambiguatedPaths. Streaming
// (awaitable, exhaust) hello is served, but hello reports the
// topologyVersion that makes drivers use it only with
// Options.StreamingHello.
//
// Besides the Go driver, the package is checked with the official MongoDB
// Node.js driver by compat/node/compat.mjs (node and npm needed):
//
//	CHANGEGATE_NODE_COMPAT=1 go test ./test/mongowire -run NodeCompat
//
// A Server is safe for concurrent use. Start one per test:
//
//	srv, err := mongowire.Start(mongowire.Options{})
//	defer srv.Close()
//	client, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
package mongowire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Options configures a Server. The zero value is usable.
type Options struct {
	// Addr is the TCP address to listen on; default "127.0.0.1:0" (a free port).
	Addr string
	// ReplicaSetName is the set name reported by hello; default "rs0".
	ReplicaSetName string
	// OplogMaxEntries bounds the change history by count; 0 means unbounded.
	OplogMaxEntries int
	// OplogMaxAge bounds the change history by age; 0 means unbounded.
	OplogMaxAge time.Duration
	// CommandLogLimit bounds the command log (oldest records are dropped);
	// default 100000, negative disables the log.
	CommandLogLimit int
	// Logger receives connection and protocol diagnostics; default discards.
	Logger *slog.Logger
	// StreamingHello makes hello report a topologyVersion, as every real
	// replica-set member does, so that drivers monitor the server with the
	// streaming (awaitable, exhaust) hello protocol; "not primary" and
	// shutdown errors then carry it too. Off by default: drivers poll, and
	// a Go driver Disconnect after the server stopped then returns at once
	// rather than waiting out its context.
	StreamingHello bool
	// TransactionLifetimeLimit is how long a multi-document transaction
	// may stay open before the server aborts it, as MongoDB's
	// transactionLifetimeLimitSeconds (default 60 s, the server's
	// default): a transaction its client abandoned (killed, paused, or cut
	// off) holds the documents it wrote against other transactions' writes
	// until then. Negative: never.
	TransactionLifetimeLimit time.Duration
}

// Server is a running (or stopped) mongowire server. Its data and history
// survive Stop/Restart and are lost on Close.
type Server struct {
	opts   Options
	logger *slog.Logger
	data   *store

	mu      sync.Mutex // guards the fields below
	ln      net.Listener
	addr    string
	conns   map[*conn]struct{}
	gate    chan struct{} // closed while not paused
	running bool
	closed  bool
	wg      sync.WaitGroup

	connSeq atomic.Int32
	reqSeq  atomic.Int32
	// processID is hello's topologyVersion.processId, new for every
	// listen (a restarted server is a new process); the counter stays 0.
	processID atomic.Pointer[bson.ObjectID]

	curMu   sync.Mutex
	cursors map[int64]cursor

	fpMu       sync.Mutex
	failPoints []*failPoint
	fragHold   atomic.Pointer[FragmentHold] // hold.go

	logMu  sync.Mutex
	cmdLog []CommandRecord

	retryMu    sync.Mutex
	retryCache map[retryKey][]byte
	retryOrder []retryKey
}

// Start listens on opts.Addr (default a free loopback port) and serves until
// Close. The caller must Close the returned Server.
func Start(opts Options) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.ReplicaSetName == "" {
		opts.ReplicaSetName = "rs0"
	}
	if opts.CommandLogLimit == 0 {
		opts.CommandLogLimit = 100000
	}
	if opts.TransactionLifetimeLimit == 0 {
		opts.TransactionLifetimeLimit = 60 * time.Second
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	gate := make(chan struct{})
	close(gate)
	s := &Server{
		opts:       opts,
		logger:     logger,
		data:       newStore(opts.OplogMaxEntries, opts.OplogMaxAge),
		conns:      map[*conn]struct{}{},
		gate:       gate,
		cursors:    map[int64]cursor{},
		retryCache: map[retryKey][]byte{},
	}
	s.data.txnLifetime = opts.TransactionLifetimeLimit
	if err := s.listen(opts.Addr); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mongowire: listen %s: %w", addr, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ln = ln
	s.addr = ln.Addr().String()
	if s.opts.StreamingHello {
		pid := bson.NewObjectID()
		s.processID.Store(&pid)
	}
	s.running = true
	s.wg.Add(1)
	go s.acceptLoop(ln)
	s.logger.Info("mongowire listening", "addr", s.addr)
	return nil
}

// Addr returns the host:port the server listens (or last listened) on.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// URI returns a connection string for the replica set, e.g.
// "mongodb://127.0.0.1:PORT/?replicaSet=rs0".
func (s *Server) URI() string {
	addr := s.Addr()
	// A wildcard listener is dialled on loopback.
	if host, port, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	return "mongodb://" + addr + "/?replicaSet=" + s.opts.ReplicaSetName
}

// Stop simulates a server shutdown: it closes the listener and every
// connection and forgets all cursors, keeping data and change history.
// Restart serves again on the same address. Stop on a stopped server is a no-op.
func (s *Server) Stop() error {
	s.mu.Lock()
	if !s.running {
		s.mu.Unlock()
		return nil
	}
	s.running = false
	err := s.ln.Close()
	for c := range s.conns {
		c.close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.curMu.Lock()
	s.cursors = map[int64]cursor{}
	s.curMu.Unlock()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Restart listens again on the address of the previous listener, with the
// same data and change history, after Stop. It fails if the port was taken
// meanwhile or the server is closed; on a running server it is a no-op.
func (s *Server) Restart() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("mongowire: restart after close")
	}
	if s.running {
		s.mu.Unlock()
		return nil
	}
	addr := s.addr
	s.mu.Unlock()
	return s.listen(addr)
}

// Pause makes the server stop answering without closing anything: requests
// on open connections and new connections are held (unread replies, as a hung
// or partitioned server) until Resume. Stop and Close still work while paused.
func (s *Server) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.gate:
		s.gate = make(chan struct{})
	default:
	}
}

// Resume ends a Pause; held requests are then served in order.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.gate:
	default:
		close(s.gate)
	}
}

// Close stops the server for good; Restart then fails. It is safe to call
// more than once.
func (s *Server) Close() error {
	s.Resume()
	err := s.Stop()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return err
}

func (s *Server) currentGate() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gate
}

func (s *Server) acceptLoop(ln net.Listener) {
	defer s.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.logger.Warn("mongowire accept", "err", err)
			}
			return
		}
		c := &conn{
			srv:  s,
			nc:   nc,
			id:   s.connSeq.Add(1),
			done: make(chan struct{}),
		}
		c.ctx, c.cancel = context.WithCancel(context.Background())
		s.mu.Lock()
		if !s.running {
			s.mu.Unlock()
			_ = nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// conn is one client connection. Requests are served one at a time.
type conn struct {
	srv     *Server
	nc      net.Conn
	id      int32
	appName string
	w       msgWriter
	// exhaust is set while the connection streams hello replies (an
	// awaitable hello sent with exhaustAllowed).
	exhaust *command
	// helloWait is how long an awaitable hello waits (maxAwaitTimeMS).
	helloWait time.Duration

	closeOnce sync.Once
	done      chan struct{}
	ctx       context.Context // cancelled by close
	cancel    context.CancelFunc
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.cancel()
		close(c.done)
		_ = c.nc.Close()
	})
}

func (c *conn) serve() {
	defer c.close()
	br := bufio.NewReaderSize(c.nc, 64*1024)
	bw := bufio.NewWriterSize(c.nc, 64*1024)
	log := c.srv.logger.With("conn", c.id)
	for {
		m, err := readMessage(br)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Debug("mongowire read", "err", err)
			}
			return
		}
		select {
		case <-c.srv.currentGate():
		case <-c.done:
			return
		}
		out, keep := c.handle(m)
		if !keep {
			return
		}
		if out == nil {
			continue
		}
		if _, err := bw.Write(out); err != nil {
			return
		}
		if err := bw.Flush(); err != nil {
			return
		}
		if cap(c.w.buf) > 4*maxBSONSize {
			c.w.buf = nil // don't pin a huge batch buffer
		}
		if c.exhaust != nil {
			c.streamHello(bw, out)
			return
		}
	}
}

// streamHello serves the streaming (exhaust) hello protocol: after an
// awaitable hello sent with exhaustAllowed, the server sends a further hello
// reply every maxAwaitTimeMS, each flagged moreToCome and answering the
// previous reply, without further requests, until the connection closes.
// The topology of a one-node set never changes, so every reply waits the
// full maxAwaitTimeMS.
func (c *conn) streamHello(bw *bufio.Writer, prev []byte) {
	s := c.srv
	cmd := c.exhaust
	for {
		prevID := int32(binary.LittleEndian.Uint32(prev[4:]))
		t := time.NewTimer(c.helloWait)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return
		}
		select {
		case <-s.currentGate():
		case <-c.done:
			return
		}
		c.w.startMsg(prevID)
		out, err := s.cmdHello(cmd, c.w.buf)
		if err != nil {
			return
		}
		c.w.buf = out
		c.w.setMoreToCome()
		prev = c.w.finish(s.reqSeq.Add(1))
		if _, err := bw.Write(prev); err != nil {
			return
		}
		if err := bw.Flush(); err != nil {
			return
		}
	}
}

// awaitableHello reports whether cmd is an awaitable hello: one carrying
// topologyVersion and maxAwaitTimeMS, which the server answers when its
// topology changes or maxAwaitTimeMS passes. It returns the time to wait
// (0 when the client's topologyVersion is stale, so the answer is
// immediate) or an error for a malformed request.
func (s *Server) awaitableHello(cmd *command) (bool, time.Duration, error) {
	tv, hasTV := cmd.body.Lookup("topologyVersion").DocumentOK()
	mv, err := cmd.body.LookupErr("maxAwaitTimeMS")
	hasMax := err == nil
	if !hasTV && !hasMax {
		return false, 0, nil
	}
	if hasTV != hasMax {
		return false, 0, cmdErr(codeFailedToParse, "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'")
	}
	if !mv.IsNumber() || num(mv) < 0 {
		return false, 0, cmdErr(codeBadValue, "maxAwaitTimeMS must be a non-negative integer")
	}
	wait := time.Duration(num(mv)) * time.Millisecond
	pid, _ := tv.Lookup("processId").ObjectIDOK()
	counter, _ := tv.Lookup("counter").AsInt64OK()
	if cur := s.processID.Load(); cur == nil || pid != *cur || counter < 0 {
		return true, 0, nil // stale: answer at once with the current state
	}
	return true, wait, nil
}

// command is one decoded command.
type command struct {
	name string
	db   string
	body bson.Raw
	seqs []docSequence
	conn *conn
	ctx  context.Context // cancelled when the connection closes
	txn  *transaction    // the transaction the command runs in (txn.go)
}

// docs returns the documents of a kind-1 sequence or, failing that, of the
// same-named array field of the body.
func (cmd *command) docs(field string) ([]bson.Raw, error) {
	for _, s := range cmd.seqs {
		if s.id == field {
			return s.docs, nil
		}
	}
	v, err := cmd.body.LookupErr(field)
	if err != nil {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, cmdErr(codeTypeMismatch, "BSON field '%s.%s' is the wrong type '%s', expected type 'array'", cmd.name, field, v.Type)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, err
	}
	out := make([]bson.Raw, 0, len(vals))
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, cmdErr(codeTypeMismatch, "BSON field '%s.%s' items must be objects", cmd.name, field)
		}
		out = append(out, d)
	}
	return out, nil
}

// handle serves one message and returns the reply frame (nil for none) and
// whether to keep the connection open.
func (c *conn) handle(m *message) ([]byte, bool) {
	s := c.srv
	isLegacy := m.opCode == opQuery
	cmd := &command{body: m.body, seqs: m.seqs, conn: c}
	if first, err := m.body.IndexErr(0); err == nil {
		cmd.name = first.Key()
	}
	if isLegacy {
		cmd.db, _, _ = cutDot(m.fullCollectionName)
	} else {
		cmd.db, _ = m.body.Lookup("$db").StringValueOK()
	}
	cmd.ctx = c.ctx
	s.record(cmd)

	if isLegacy {
		c.w.startReply(m.requestID)
	} else {
		c.w.startMsg(m.requestID)
	}
	start := len(c.w.buf)

	var (
		out []byte
		err error
	)
	fp := s.matchFailPoint(cmd.name, c.appName)
	if fp != nil && fp.BlockFor > 0 {
		t := time.NewTimer(fp.BlockFor)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return nil, false
		}
	}
	switch {
	case fp != nil && fp.CloseConnection:
		return nil, false
	case fp != nil && fp.ErrorCode != 0:
		labels := fp.ErrorLabels
		if labels == nil {
			labels = s.serverLabels(cmd, fp.ErrorCode, 0, fp.AfterCursorCheckout)
		}
		err = &CommandError{Code: fp.ErrorCode, Message: "Failing command via 'failCommand' failpoint", Labels: labels}
	case isLegacy && !isHello(cmd.name):
		err = cmdErr(codeUnsupportedOpQuery, "Unsupported OP_QUERY command: %s. The client driver may require an upgrade.", cmd.name)
	case cmd.db == "" && !isLegacy:
		err = cmdErr(codeFailedToParse, "OP_MSG requests require a $db argument")
	case !isLegacy && isHello(cmd.name):
		var (
			awaitable bool
			wait      time.Duration
		)
		awaitable, wait, err = s.awaitableHello(cmd)
		if err != nil {
			break
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return nil, false
			}
		}
		if out, err = s.dispatch(cmd, c.w.buf); err == nil && awaitable && m.flags&flagExhaustAllowed != 0 {
			c.w.buf = out
			c.w.setMoreToCome()
			c.exhaust, c.helloWait = cmd, wait
			if wait <= 0 {
				c.helloWait = time.Second
			}
		}
	default:
		out, err = s.dispatch(cmd, c.w.buf)
	}
	if err != nil {
		s.logger.Debug("mongowire command failed", "conn", c.id, "command", cmd.name, "db", cmd.db, "err", err)
		var ce *CommandError
		if errors.As(err, &ce) && ce.Labels == nil && (fp == nil || fp.ErrorCode == 0) {
			if labels := s.serverLabels(cmd, ce.Code, 0, true); labels != nil {
				labelled := *ce
				labelled.Labels = labels
				err = &labelled
			}
		}
		out = s.appendError(c.w.buf[:start], err)
	}
	if err == nil {
		switch {
		case fp != nil && fp.WriteConcernError != nil:
			out = appendWriteConcernError(out, start, fp.WriteConcernError, fp.ErrorLabels, s.serverLabels(cmd, 0, fp.WriteConcernError.Code, true))
		default:
			if w := unsatisfiable(cmd); w != nil {
				out = appendWriteConcernError(out, start, w, nil, s.serverLabels(cmd, 0, w.Code, true))
			}
		}
	}
	c.w.buf = out
	if fp != nil && fp.DropReply {
		return nil, false
	}
	if m.flags&flagMoreToCome != 0 {
		return nil, true
	}
	return c.w.finish(s.reqSeq.Add(1)), true
}

// unsatisfiable returns the write-concern error of a write concern a
// one-node replica set cannot satisfy: w above 1 (UnsatisfiableWriteConcern,
// "Not enough data-bearing nodes") or a w tag other than "majority"
// (UnknownReplWriteConcern); nil when it can (write_concern.cpp
// validateWriteConcern).
func unsatisfiable(cmd *command) *WriteConcernError {
	wc, ok := cmd.body.Lookup("writeConcern").DocumentOK()
	if !ok {
		return nil
	}
	w := wc.Lookup("w")
	switch {
	case w.IsNumber() && num(w) > 1:
		return &WriteConcernError{Code: 100, Message: "Not enough data-bearing nodes"}
	case w.Type == bson.TypeString && w.StringValue() != "majority":
		return &WriteConcernError{Code: 79, Message: fmt.Sprintf("No write concern mode named '%s' found in replica set configuration", w.StringValue())}
	}
	return nil
}

// appendWriteConcernError adds writeConcernError w and error labels (the
// given ones, or else the derived ones) to the reply document at
// out[start:].
func appendWriteConcernError(out []byte, start int, w *WriteConcernError, given, derived []string) []byte {
	doc := out[:len(out)-1] // without the reply's terminating 0
	widx, doc := bsoncore.AppendDocumentElementStart(doc, "writeConcernError")
	doc = bsoncore.AppendInt32Element(doc, "code", w.Code)
	name := w.CodeName
	if name == "" {
		name = codeName(w.Code)
	}
	doc = bsoncore.AppendStringElement(doc, "codeName", name)
	doc = bsoncore.AppendStringElement(doc, "errmsg", w.Message)
	if len(w.Info) > 0 {
		doc = bsoncore.AppendDocumentElement(doc, "errInfo", w.Info)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, widx)
	labels := given
	if labels == nil {
		labels = derived
	}
	if len(labels) > 0 {
		aidx, d := bsoncore.AppendArrayElementStart(doc, "errorLabels")
		for i, l := range labels {
			d = bsoncore.AppendStringElement(d, arrayKey(i), l)
		}
		doc, _ = bsoncore.AppendArrayEnd(d, aidx)
	}
	doc = append(doc, 0)
	binary.LittleEndian.PutUint32(doc[start:], uint32(len(doc)-start))
	return doc
}

func isHello(name string) bool {
	return name == "hello" || name == "isMaster" || name == "ismaster"
}

func cutDot(ns string) (string, string, bool) {
	for i := 0; i < len(ns); i++ {
		if ns[i] == '.' {
			return ns[:i], ns[i+1:], true
		}
	}
	return ns, "", false
}

// appendOK ends a reply document begun at idx with ok:1, $clusterTime and
// operationTime.
func (s *Server) appendOK(dst []byte, idx int32) []byte {
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	dst = s.appendTimes(dst, s.data.clusterTime())
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

// appendOKAt is appendOK with an explicit operationTime (a write's own time).
func (s *Server) appendOKAt(dst []byte, idx int32, opTime bson.Timestamp) []byte {
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	dst = s.appendTimes(dst, opTime)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

func (s *Server) appendTimes(dst []byte, opTime bson.Timestamp) []byte {
	ct := s.data.clusterTime()
	if tsLess(ct, opTime) {
		ct = opTime
	}
	idx, dst := bsoncore.AppendDocumentElementStart(dst, "$clusterTime")
	dst = bsoncore.AppendTimestampElement(dst, "clusterTime", ct.T, ct.I)
	sidx, dst := bsoncore.AppendDocumentElementStart(dst, "signature")
	dst = bsoncore.AppendBinaryElement(dst, "hash", 0, make([]byte, 20))
	dst = bsoncore.AppendInt64Element(dst, "keyId", 0)
	dst, _ = bsoncore.AppendDocumentEnd(dst, sidx)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return bsoncore.AppendTimestampElement(dst, "operationTime", opTime.T, opTime.I)
}

func (s *Server) appendError(dst []byte, err error) []byte {
	var ce *CommandError
	if !errors.As(err, &ce) {
		ce = &CommandError{Code: codeInternalError, Message: err.Error()}
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendDoubleElement(dst, "ok", 0)
	dst = bsoncore.AppendStringElement(dst, "errmsg", ce.Message)
	dst = bsoncore.AppendInt32Element(dst, "code", ce.Code)
	dst = bsoncore.AppendStringElement(dst, "codeName", codeName(ce.Code))
	dst = ce.appendInfo(dst)
	if stateChangeCodes[ce.Code] {
		// Like a replica-set member, attach the current topologyVersion
		// to "not primary" and shutdown errors: a client compares it with
		// the one it monitors and ignores the error for server discovery
		// when it is not newer (no topology change happened).
		dst = s.appendTopologyVersion(dst)
	}
	if len(ce.Labels) > 0 {
		aidx, d := bsoncore.AppendArrayElementStart(dst, "errorLabels")
		dst = d
		for i, l := range ce.Labels {
			dst = bsoncore.AppendStringElement(dst, arrayKey(i), l)
		}
		dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	}
	dst = s.appendTimes(dst, s.data.clusterTime())
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

var smallKeys = func() [1024]string {
	var k [1024]string
	for i := range k {
		k[i] = fmt.Sprint(i)
	}
	return k
}()

// arrayKey returns the BSON array key for index i.
func arrayKey(i int) string {
	if i < len(smallKeys) {
		return smallKeys[i]
	}
	return fmt.Sprint(i)
}

// CommandRecord is one command as the server received it.
type CommandRecord struct {
	// Name is the command name (the body's first key), e.g. "aggregate".
	Name string
	// DB is the target database ($db).
	DB string
	// Body is the command document, with any OP_MSG document sequences
	// (documents, updates, deletes) merged in as arrays.
	Body bson.Raw
	// ConnectionID identifies the client connection (hello's connectionId).
	ConnectionID int32
	// Time is when the server received the command.
	Time time.Time
}

func (s *Server) record(cmd *command) {
	if s.opts.CommandLogLimit < 0 {
		return
	}
	body := cmd.body
	if len(cmd.seqs) > 0 {
		b := append([]byte(nil), body[:len(body)-1]...)
		for _, seq := range cmd.seqs {
			idx, d := bsoncore.AppendArrayElementStart(b, seq.id)
			b = d
			for i, doc := range seq.docs {
				b = bsoncore.AppendDocumentElement(b, arrayKey(i), doc)
			}
			b, _ = bsoncore.AppendArrayEnd(b, idx)
		}
		b = append(b, 0)
		b[0], b[1], b[2], b[3] = byte(len(b)), byte(len(b)>>8), byte(len(b)>>16), byte(len(b)>>24)
		body = b
	}
	rec := CommandRecord{Name: cmd.name, DB: cmd.db, Body: body, ConnectionID: cmd.conn.id, Time: time.Now()}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	if len(s.cmdLog) >= s.opts.CommandLogLimit {
		n := copy(s.cmdLog, s.cmdLog[len(s.cmdLog)/2:])
		s.cmdLog = s.cmdLog[:n]
	}
	s.cmdLog = append(s.cmdLog, rec)
}

// Commands returns a copy of the command log, oldest first. Bodies must not
// be modified.
func (s *Server) Commands() []CommandRecord {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return append([]CommandRecord(nil), s.cmdLog...)
}

// CommandsNamed returns the logged commands with the given name, oldest first.
func (s *Server) CommandsNamed(name string) []CommandRecord {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	var out []CommandRecord
	for _, r := range s.cmdLog {
		if r.Name == name {
			out = append(out, r)
		}
	}
	return out
}

// ResetCommands empties the command log.
func (s *Server) ResetCommands() {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.cmdLog = nil
}

// ClusterTime returns the latest cluster time the server has handed out
// (the operationTime of the most recent write).
func (s *Server) ClusterTime() bson.Timestamp {
	return s.data.clusterTime()
}

// TruncateHistory discards change history recorded before the cluster time
// before. Afterwards, opening or resuming a change stream from a token or
// operation time earlier than before fails with code 286
// (ChangeStreamHistoryLost).
func (s *Server) TruncateHistory(before bson.Timestamp) {
	s.data.mu.Lock()
	defer s.data.mu.Unlock()
	o := &s.data.oplog
	n := 0
	for n < len(o.entries) && tsLess(o.entries[n].ts, before) {
		n++
	}
	s.data.dropEntries(n)
	if tsLess(o.lostBefore, before) {
		o.lostBefore = before
	}
}

// DiscardHistory discards all change history recorded so far: every resume
// token and operation time handed out before the call fails with code 286.
func (s *Server) DiscardHistory() {
	s.data.mu.Lock()
	ts := s.data.tick()
	s.data.mu.Unlock()
	s.TruncateHistory(ts)
}

// retryableCodes are the errors after which the server labels a retryable
// write RetryableWriteError and a change stream getMore
// ResumableChangeStreamError.
var retryableCodes = map[int32]bool{6: true, 7: true, 89: true, 91: true, 189: true, 262: true, 9001: true,
	10107: true, 11600: true, 11602: true, 13435: true, 13436: true}

// stateChangeCodes are the server's NotPrimaryError and ShutdownError
// categories, whose error replies carry topologyVersion.
var stateChangeCodes = map[int32]bool{10107: true, 13435: true, 13436: true, 11602: true, 189: true, 91: true, 11600: true}

// appendTopologyVersion appends hello's topologyVersion element.
func (s *Server) appendTopologyVersion(dst []byte) []byte {
	pid := s.processID.Load()
	if pid == nil {
		return dst
	}
	idx, dst := bsoncore.AppendDocumentElementStart(dst, "topologyVersion")
	dst = bsoncore.AppendObjectIDElement(dst, "processId", *pid)
	dst = bsoncore.AppendInt64Element(dst, "counter", 0)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

// resumableOnlyCodes are further codes after which a change stream is
// resumable: NeedRetargettingError (StaleShardVersion, StaleEpoch,
// StaleConfig), RetryChangeStream and FailedToSatisfyReadPreference
// (ErrorLabelBuilder::isResumableChangeStreamError).
var resumableOnlyCodes = map[int32]bool{63: true, 133: true, 150: true, 234: true, 13388: true}

// nonResumableCodes are the NonResumableChangeStreamError category of
// error_codes.yml: ChangeStreamFatalError and ChangeStreamHistoryLost.
var nonResumableCodes = map[int32]bool{codeChangeStreamFatalError: true, codeChangeStreamHistory: true}

// transientCodes are the codes isTransientTransactionError always labels
// TransientTransactionError in a transaction: WriteConflict, LockTimeout,
// PreparedTransactionInProgress, StaleDbVersion, the snapshot errors
// (SnapshotTooOld, SnapshotUnavailable, StaleChunkHistory,
// MigrationConflict) and NeedRetargettingError.
var transientCodes = map[int32]bool{112: true, 24: true, 267: true, 249: true, 239: true, 246: true, 241: true,
	284: true, 63: true, 150: true, 13388: true}

// serverLabels returns the error labels the server attaches to an error
// with code (and write-concern error wcCode, 0 for none) of cmd, following
// ErrorLabelBuilder::build (src/mongo/db/error_labels.cpp). cursorCheckedOut
// is false for a failCommand fault, which fires before a getMore checks out
// its cursor: such a getMore is not recognised as a change stream's, so it
// gets no ResumableChangeStreamError.
func (s *Server) serverLabels(cmd *command, code, wcCode int32, cursorCheckedOut bool) []string {
	_, err := cmd.body.LookupErr("txnNumber")
	hasTxn := err == nil
	auto := inTxn(cmd)
	commitOrAbort := cmd.name == "commitTransaction" || cmd.name == "abortTransaction"
	if code != 0 && hasTxn && auto {
		transient := transientCodes[code]
		if commitOrAbort {
			transient = transient || code == codeNoSuchTransaction && wcCode == 0
		} else {
			transient = transient || retryableCodes[code] || code == codeNoSuchTransaction
		}
		if transient {
			return []string{labelTransient}
		}
	}
	if hasTxn && (!auto || commitOrAbort) && (retryableCodes[code] || retryableCodes[wcCode]) {
		return []string{labelRetryableWrite}
	}
	if code != 0 && wcCode == 0 && (retryableCodes[code] || resumableOnlyCodes[code]) && s.isChangeStreamCmd(cmd, cursorCheckedOut) {
		return []string{labelResumable}
	}
	if nonResumableCodes[code] {
		return []string{labelNonResumable}
	}
	return nil
}

// isChangeStreamCmd reports whether cmd is a change stream's aggregate, or
// a getMore on a change stream cursor once checked out.
func (s *Server) isChangeStreamCmd(cmd *command, cursorCheckedOut bool) bool {
	switch cmd.name {
	case "aggregate":
		stages, err := pipelineStages(cmd)
		return err == nil && len(stages) > 0 && stages[0].Index(0).Key() == "$changeStream"
	case "getMore":
		if !cursorCheckedOut {
			return false
		}
		id, _ := cmd.body.Lookup("getMore").Int64OK()
		s.curMu.Lock()
		_, isStream := s.cursors[id].(*streamCursor)
		s.curMu.Unlock()
		return isStream
	}
	return false
}
