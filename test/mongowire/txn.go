package mongowire

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Multi-document transactions.
//
// A command carrying autocommit: false runs in the transaction of its
// session (lsid) and txnNumber; startTransaction: true begins one. The
// transaction works on private copies of the collections it touches, made
// the first time it reads or writes each one, and records its changes
// instead of appending them to the oplog. Other readers and change streams
// see nothing of it until commitTransaction, which applies its writes to the
// shared collections and appends all its changes at one cluster time, in
// order, each with the session's lsid, the txnNumber and its index in the
// transaction (txnOpIndex, also in the resume token). abortTransaction, a
// write conflict, any failed command or write error in the transaction, a
// newer transaction on the session, endSessions and killAllSessions discard
// the copies, and so does the transaction lifetime limit
// (Options.TransactionLifetimeLimit, MongoDB's transactionLifetimeLimitSeconds,
// 60 s by default): an open transaction older than that is aborted — when its
// session next uses it (NoSuchTransaction), or when another transaction
// writes a document it holds (which then proceeds). Until then, a transaction
// abandoned by its client (killed, paused, cut off) keeps the documents it
// wrote: every other transaction writing one fails with WriteConflict.
//
// Isolation (see NOTES.md): snapshot isolation per collection — a
// transaction reads each collection as of its first access to it, plus its
// own writes. A write to a document that another open transaction wrote, or
// that was changed outside the transaction after its copy was taken, fails
// with WriteConflict (112, TransientTransactionError) and aborts the
// transaction; a change made outside after the transaction's own write is
// detected at commit, which then fails the same way (MongoDB would make the
// outside write wait for the transaction instead).

type txnState uint8

const (
	txnNone txnState = iota
	txnInProgress
	txnCommitted
	txnAborted
)

// session is the transaction state of one logical session.
type session struct {
	txnNumber int64 // the session's latest transaction number
	state     txnState
	txn       *transaction // while state == txnInProgress
	commitTS  bson.Timestamp
}

// transaction is an open multi-document transaction.
type transaction struct {
	sess    *session
	lsid    bson.Raw // as change events carry it: {id, uid}
	number  int64
	colls   map[string]*txnColl // by namespace
	ops     []*oplogEntry       // recorded changes, in order
	writes  []string            // keys of store.txnWrites held
	started time.Time           // for the lifetime limit
	// conflict: a write conflicted; the command fails and aborts the
	// transaction.
	conflict bool
}

// txnColl is a transaction's copy of one collection.
type txnColl struct {
	c        *collection // the copy; nil for a collection that does not exist
	base     *collection // the shared collection copied, nil if none existed
	cloneSeq uint64      // oplog position when the copy was taken
}

// noAuthUID is the lsid uid of sessions without authentication: the
// SHA-256 of the empty user name, as the server puts it in change events.
var noAuthUID = sha256.Sum256(nil)

// eventLsid builds the lsid of change events from the one a client sent.
func eventLsid(clientLsid bson.Raw) bson.Raw {
	b := bsoncore.NewDocumentBuilder()
	if id, err := clientLsid.LookupErr("id"); err == nil {
		b.AppendValue("id", bsoncore.Value{Type: bsoncore.Type(id.Type), Data: id.Value})
	}
	b.AppendBinary("uid", 0, noAuthUID[:])
	return bson.Raw(b.Build())
}

// coll returns the transaction's copy of db.name, taking it on first
// access; with create it creates a missing collection in the transaction
// and reports so.
func (t *transaction) coll(s *store, db, name string, create bool) (*collection, bool) {
	ns := db + "." + name
	tc := t.colls[ns]
	if tc == nil {
		base := s.baseColl(db, name)
		tc = &txnColl{base: base, cloneSeq: s.oplog.lastSeq()}
		if base != nil {
			tc.c = base.clone()
		}
		t.colls[ns] = tc
	}
	if tc.c == nil && create {
		tc.c = newCollection(db, name)
		tc.c.createdAt = s.clock
		return tc.c, true
	}
	return tc.c, false
}

// clone copies a collection: documents (immutable BSON, shared), entries,
// indexes.
func (c *collection) clone() *collection {
	n := &collection{db: c.db, name: c.name, uuid: c.uuid, prePost: c.prePost, createdAt: c.createdAt,
		byID: make(map[string]*docEntry, len(c.byID)), order: make([]*docEntry, 0, len(c.byID)),
		lastWrite: map[string]uint64{}}
	for _, e := range c.order {
		if e.dead {
			continue
		}
		ne := &docEntry{id: e.id, doc: e.doc}
		n.byID[e.id] = ne
		n.order = append(n.order, ne)
	}
	for _, ix := range c.indexes {
		nix := *ix
		if ix.entries != nil {
			nix.entries = make(map[string]string, len(ix.entries))
			for k, v := range ix.entries {
				nix.entries[k] = v
			}
		}
		n.indexes = append(n.indexes, &nix)
	}
	return n
}

// conflicts reports whether the shared state changed under a change the
// transaction made to document k of namespace ns.
func (t *transaction) conflicts(s *store, e *oplogEntry, k string) bool {
	tc := t.colls[e.db+"."+e.coll]
	real := s.baseColl(e.db, e.coll)
	if tc == nil || real != tc.base {
		return true // created, dropped or renamed meanwhile
	}
	return real != nil && real.lastWrite[k] > tc.cloneSeq
}

// record notes a change made in the transaction; a write to a document
// that another open transaction wrote or that changed since the copy was
// taken marks a conflict.
func (t *transaction) record(s *store, e *oplogEntry) {
	if e.docKey != nil {
		k, _, _ := idKey(e.docKey)
		if t.conflicts(s, e, k) {
			t.conflict = true
		}
		wk := e.db + "." + e.coll + "\x00" + k
		switch owner := s.txnWrites[wk]; {
		case owner == nil:
			s.txnWrites[wk] = t
			t.writes = append(t.writes, wk)
		case owner != t && s.expired(owner):
			// The server's reaper aborts a transaction past its
			// lifetime; its claims go with it.
			s.abortTxn(owner)
			s.txnWrites[wk] = t
			t.writes = append(t.writes, wk)
		case owner != t:
			t.conflict = true
		}
	}
	e.lsid, e.txnNumber, e.txnOpIndex = t.lsid, t.number, uint32(len(t.ops))
	t.ops = append(t.ops, e)
}

// expired reports whether open transaction t is past the lifetime limit;
// the caller holds mu.
func (s *store) expired(t *transaction) bool {
	return s.txnLifetime > 0 && s.nowFn().Sub(t.started) >= s.txnLifetime
}

// reapIfExpired aborts the open transaction of sess when it is past the
// lifetime limit; the caller holds mu exclusively.
func (s *store) reapIfExpired(sess *session) {
	if sess != nil && sess.state == txnInProgress && sess.txn != nil && s.expired(sess.txn) {
		s.abortTxn(sess.txn)
	}
}

// release drops the transaction's write claims; the caller holds mu.
func (s *store) release(t *transaction) {
	for _, wk := range t.writes {
		if s.txnWrites[wk] == t {
			delete(s.txnWrites, wk)
		}
	}
	t.writes = nil
}

// abortTxn discards an open transaction; the caller holds mu exclusively.
func (s *store) abortTxn(t *transaction) {
	s.release(t)
	if t.sess.txn == t {
		t.sess.txn, t.sess.state = nil, txnAborted
	}
}

// commitTxn applies an open transaction and appends its changes at one
// cluster time; on a write conflict it aborts the transaction instead. The
// caller holds mu exclusively, with no transaction bound.
func (s *store) commitTxn(t *transaction) (bson.Timestamp, *CommandError) {
	for _, e := range t.ops {
		if e.docKey == nil {
			continue
		}
		if k, _, _ := idKey(e.docKey); t.conflicts(s, e, k) {
			s.abortTxn(t)
			return bson.Timestamp{}, writeConflict()
		}
	}
	// Collections the transaction created are installed as they are;
	// the changes to existing ones are replayed on them (no conflict: the
	// documents are as they were when copied).
	created := map[string]bool{}
	names := make([]string, 0, len(t.colls))
	for ns := range t.colls {
		names = append(names, ns)
	}
	slices.Sort(names)
	for _, ns := range names {
		tc := t.colls[ns]
		if tc.base == nil && tc.c != nil {
			d := s.dbs[tc.c.db]
			if d == nil {
				d = &database{name: tc.c.db, colls: map[string]*collection{}}
				s.dbs[tc.c.db] = d
			}
			d.colls[tc.c.name] = tc.c
			created[ns] = true
		}
	}
	for _, e := range t.ops {
		if created[e.db+"."+e.coll] || e.docKey == nil {
			continue
		}
		c := s.baseColl(e.db, e.coll)
		k, _, _ := idKey(e.docKey)
		switch e.op {
		case opInsert:
			c.insertDoc(k, e.post)
		case opUpdate, opReplace:
			if de := c.byID[k]; de != nil {
				c.replaceDoc(de, e.post)
			}
		case opDelete:
			if de := c.byID[k]; de != nil {
				c.deleteDoc(de)
			}
		}
	}
	ts := s.tick()
	if len(t.ops) > 0 {
		s.appendOps(t.ops, ts)
	}
	s.release(t)
	t.sess.txn, t.sess.state, t.sess.commitTS = nil, txnCommitted, ts
	return ts, nil
}

func writeConflict() *CommandError {
	return &CommandError{Code: codeWriteConflict, Labels: []string{labelTransient},
		Message: "Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction."}
}

func noSuchTxn(format string, args ...any) *CommandError {
	return &CommandError{Code: codeNoSuchTransaction, Labels: []string{labelTransient}, Message: fmt.Sprintf(format, args...)}
}

// Error labels (src/mongo/db/error_labels.h).
const (
	labelTransient      = "TransientTransactionError"
	labelRetryableWrite = "RetryableWriteError"
	labelResumable      = "ResumableChangeStreamError"
	labelNonResumable   = "NonResumableChangeStreamError"
)

// txnCommands are the commands a transaction may run
// (src/mongo/db/transaction/transaction_participant.cpp, kCmdWhitelist and
// the commands allowed to create collections); others fail with
// OperationNotSupportedInTransaction.
var txnCommands = map[string]bool{"abortTransaction": true, "aggregate": true, "commitTransaction": true,
	"create": true, "createIndexes": true, "delete": true, "distinct": true, "find": true, "findandmodify": true,
	"findAndModify": true, "getMore": true, "insert": true, "killCursors": true, "update": true, "bulkWrite": true}

// sessionKey identifies the session of cmd (its lsid document).
func sessionKey(cmd *command) (string, bson.Raw, bool) {
	lsid, ok := cmd.body.Lookup("lsid").DocumentOK()
	if !ok {
		return "", nil, false
	}
	id, err := lsid.LookupErr("id")
	if err != nil {
		return "", nil, false
	}
	return string(id.Value), lsid, true
}

// inTxn reports whether cmd is part of a multi-document transaction (it
// carries autocommit).
func inTxn(cmd *command) bool {
	_, err := cmd.body.LookupErr("autocommit")
	return err == nil
}

// txnArgs validates the transaction fields of cmd.
func txnArgs(cmd *command) (key string, lsid bson.Raw, number int64, err error) {
	if ac, ok := cmd.body.Lookup("autocommit").BooleanOK(); !ok || ac {
		return "", nil, 0, cmdErr(codeInvalidOptions, "Specifying autocommit=true is not allowed.")
	}
	key, lsid, ok := sessionKey(cmd)
	if !ok {
		return "", nil, 0, cmdErr(codeInvalidOptions, "'autocommit' field requires a session id")
	}
	v, lerr := cmd.body.LookupErr("txnNumber")
	if lerr != nil {
		return "", nil, 0, cmdErr(codeInvalidOptions, "'autocommit' field requires a transaction number to also be specified")
	}
	number, ok = v.AsInt64OK()
	if !ok {
		return "", nil, 0, cmdErr(codeTypeMismatch, "BSON field 'OperationSessionInfo.txnNumber' is the wrong type '%s', expected type 'long'", v.Type)
	}
	return key, lsid, number, nil
}

// joinTxn returns the open transaction cmd runs in, starting it for
// startTransaction: true.
func (s *Server) joinTxn(cmd *command) (*transaction, error) {
	if !txnCommands[cmd.name] {
		return nil, cmdErr(codeOperationNotSupportedInTxn, "Cannot run '%s' in a multi-document transaction.", cmd.name)
	}
	key, lsid, number, err := txnArgs(cmd)
	if err != nil {
		return nil, err
	}
	start, _ := cmd.body.Lookup("startTransaction").BooleanOK()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	sess := d.sessions[key]
	if sess == nil {
		sess = &session{txnNumber: -1}
		d.sessions[key] = sess
	}
	d.reapIfExpired(sess)
	switch {
	case number < sess.txnNumber:
		return nil, cmdErr(codeTransactionTooOld, "Cannot start transaction %d on session because a newer transaction %d has already started.", number, sess.txnNumber)
	case start && number == sess.txnNumber:
		return nil, cmdErr(codeConflictingOperation, "Cannot start a transaction at given transaction number %d a transaction with the same number is in progress.", number)
	case start:
		if sess.txn != nil {
			d.abortTxn(sess.txn)
		}
		if cmd.name == "getMore" {
			return nil, cmdErr(codeInvalidOptions, "Cannot run getMore at the start of a transaction")
		}
		t := &transaction{sess: sess, lsid: eventLsid(lsid), number: number, colls: map[string]*txnColl{}, started: d.nowFn()}
		sess.txnNumber, sess.state, sess.txn = number, txnInProgress, t
		return t, nil
	case number > sess.txnNumber || sess.state == txnNone:
		return nil, noSuchTxn("Given transaction number %d does not match any in-progress transactions. The active transaction number is %d", number, sess.txnNumber)
	case sess.state == txnAborted:
		return nil, noSuchTxn("Transaction with { txnNumber: %d } has been aborted.", number)
	case sess.state == txnCommitted:
		return nil, cmdErr(codeTransactionCommitted, "Transaction with { txnNumber: %d } has been committed.", number)
	}
	if _, err := cmd.body.LookupErr("readConcern"); err == nil {
		return nil, cmdErr(codeInvalidOptions, "Only the first command in a transaction may specify a readConcern")
	}
	return sess.txn, nil
}

// dispatchInTxn runs a command of a transaction: with its copies bound,
// and aborting the transaction when the command fails, reports write
// errors or met a write conflict.
func (s *Server) dispatchInTxn(cmd *command, dst []byte) ([]byte, error) {
	t, err := s.joinTxn(cmd)
	if err != nil {
		return nil, err
	}
	if cmd.name == "aggregate" {
		if stages, err := pipelineStages(cmd); err == nil && len(stages) > 0 && stages[0].Index(0).Key() == "$changeStream" {
			s.data.mu.Lock()
			s.data.abortTxn(t)
			s.data.mu.Unlock()
			return nil, cmdErr(codeOperationNotSupportedInTxn, "Operation not permitted in transaction :: caused by :: Cannot run aggregation stage $changeStream in a multi-document transaction.")
		}
	}
	cmd.txn = t
	start := len(dst)
	out, err := s.dispatchCmd(cmd, dst)
	s.data.mu.Lock()
	defer s.data.mu.Unlock()
	if t.conflict {
		s.data.abortTxn(t)
		return nil, writeConflict()
	}
	if err != nil {
		s.data.abortTxn(t)
		return nil, err
	}
	if _, werr := bson.Raw(out[start:]).LookupErr("writeErrors"); werr == nil {
		s.data.abortTxn(t)
	}
	return out, nil
}

// cmdCommitTransaction implements commitTransaction; committing a
// committed transaction again succeeds (drivers retry commits).
func (s *Server) cmdCommitTransaction(cmd *command, dst []byte) ([]byte, error) {
	key, _, number, err := txnArgs(cmd)
	if err != nil {
		return nil, err
	}
	d := s.data
	d.mu.Lock()
	sess := d.sessions[key]
	d.reapIfExpired(sess)
	var (
		ts bson.Timestamp
		ce *CommandError
	)
	switch {
	case sess == nil || number > sess.txnNumber || sess.state == txnNone:
		ce = noSuchTxn("Given transaction number %d does not match any in-progress transactions.", number)
	case number < sess.txnNumber:
		ce = cmdErr(codeTransactionTooOld, "Cannot commit transaction %d on session because a newer transaction %d has already started.", number, sess.txnNumber)
	case sess.state == txnAborted:
		ce = noSuchTxn("Transaction with { txnNumber: %d } has been aborted.", number)
	case sess.state == txnCommitted:
		ts = sess.commitTS
	default:
		ts, ce = d.commitTxn(sess.txn)
	}
	d.mu.Unlock()
	if ce != nil {
		return nil, ce
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	return s.appendOKAt(dst, idx, ts), nil
}

// cmdAbortTransaction implements abortTransaction.
func (s *Server) cmdAbortTransaction(cmd *command, dst []byte) ([]byte, error) {
	key, _, number, err := txnArgs(cmd)
	if err != nil {
		return nil, err
	}
	d := s.data
	d.mu.Lock()
	sess := d.sessions[key]
	d.reapIfExpired(sess)
	var ce *CommandError
	switch {
	case sess == nil || number != sess.txnNumber || sess.state == txnNone || sess.state == txnAborted:
		ce = noSuchTxn("Transaction with { txnNumber: %d } has been aborted.", number)
	case sess.state == txnCommitted:
		ce = cmdErr(codeTransactionCommitted, "Transaction with { txnNumber: %d } has been committed.", number)
	default:
		d.abortTxn(sess.txn)
	}
	d.mu.Unlock()
	if ce != nil {
		return nil, ce
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	return s.appendOK(dst, idx), nil
}

// cmdEndSessions implements endSessions, killSessions and killAllSessions:
// the open transactions of the sessions (all of them for killAllSessions)
// are aborted.
func (s *Server) cmdEndSessions(cmd *command, dst []byte) ([]byte, error) {
	d := s.data
	d.mu.Lock()
	if cmd.name == "killAllSessions" {
		for _, sess := range d.sessions {
			if sess.txn != nil {
				d.abortTxn(sess.txn)
			}
		}
	} else if arr, ok := cmd.body.Lookup(cmd.name).ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			doc, _ := v.DocumentOK()
			id, err := doc.LookupErr("id")
			if err != nil {
				continue
			}
			if sess := d.sessions[string(id.Value)]; sess != nil {
				if sess.txn != nil {
					d.abortTxn(sess.txn)
				}
				if cmd.name == "endSessions" {
					delete(d.sessions, string(id.Value))
				}
			}
		}
	}
	d.mu.Unlock()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	return s.appendOK(dst, idx), nil
}

// lockWrite locks the store exclusively for cmd, binding its transaction.
func (s *Server) lockWrite(cmd *command) {
	s.data.mu.Lock()
	s.data.txn = cmd.txn
}

// unlockWrite ends lockWrite.
func (s *Server) unlockWrite() {
	s.data.txn = nil
	s.data.mu.Unlock()
}

// lockRead locks the store for reading by cmd: shared outside
// transactions, exclusively (the transaction may take copies) inside.
func (s *Server) lockRead(cmd *command) {
	if cmd != nil && cmd.txn != nil {
		s.lockWrite(cmd)
		return
	}
	s.data.mu.RLock()
}

// unlockRead ends lockRead.
func (s *Server) unlockRead(cmd *command) {
	if cmd != nil && cmd.txn != nil {
		s.unlockWrite()
		return
	}
	s.data.mu.RUnlock()
}
