package mongowire

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/changegate/changegate/test/mongowire/mql"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// retryKey identifies a retryable write: the session id and txnNumber.
type retryKey struct {
	lsid string
	txn  int64
}

const retryCacheSize = 100000

func retryKeyOf(cmd *command) (retryKey, bool) {
	txn, err := cmd.body.LookupErr("txnNumber")
	if err != nil {
		return retryKey{}, false
	}
	if _, err := cmd.body.LookupErr("autocommit"); err == nil {
		return retryKey{}, false // multi-document transaction: not deduplicated
	}
	lsid, ok := cmd.body.Lookup("lsid").DocumentOK()
	if !ok {
		return retryKey{}, false
	}
	n, _ := txn.AsInt64OK()
	return retryKey{lsid: string(lsid), txn: n}, true
}

// retryableWrite runs a write command once per (lsid, txnNumber): a retried
// command gets the reply of the first execution without being re-applied.
func (s *Server) retryableWrite(cmd *command, dst []byte) ([]byte, error) {
	key, ok := retryKeyOf(cmd)
	if ok {
		s.retryMu.Lock()
		cached := s.retryCache[key]
		s.retryMu.Unlock()
		if cached != nil {
			return append(dst, cached...), nil
		}
	}
	start := len(dst)
	var (
		out []byte
		err error
	)
	switch cmd.name {
	case "insert":
		out, err = s.cmdInsert(cmd, dst)
	case "update":
		out, err = s.cmdUpdate(cmd, dst)
	case "delete":
		out, err = s.cmdDelete(cmd, dst)
	default:
		out, err = s.cmdFindAndModify(cmd, dst)
	}
	if err == nil && ok {
		s.retryMu.Lock()
		if _, dup := s.retryCache[key]; !dup {
			if len(s.retryOrder) >= retryCacheSize {
				for _, k := range s.retryOrder[:retryCacheSize/2] {
					delete(s.retryCache, k)
				}
				s.retryOrder = append(s.retryOrder[:0], s.retryOrder[retryCacheSize/2:]...)
			}
			s.retryCache[key] = append([]byte(nil), out[start:]...)
			s.retryOrder = append(s.retryOrder, key)
		}
		s.retryMu.Unlock()
	}
	return out, err
}

// writeError is one entry of a write command's writeErrors.
type writeError struct {
	index int
	err   *CommandError
}

func dupKeyErr(c *collection, ix *index, doc bson.Raw) *CommandError {
	kv := bsoncore.NewDocumentBuilder()
	desc := ""
	for i, f := range ix.fields {
		v := bson.RawValue{Type: bson.TypeNull}
		if vals := lookupPath(doc, f); len(vals) > 0 {
			v = vals[0]
		}
		kv.AppendValue(f, bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
		if i > 0 {
			desc += ", "
		}
		desc += f + ": " + v.String()
	}
	// Like the server's DuplicateKeyErrorInfo: the index key pattern and the
	// offending key, both in write errors and in command errors.
	info := bsoncore.NewDocumentBuilder().AppendDocument("keyPattern", bsoncore.Document(ix.key)).
		AppendDocument("keyValue", kv.Build()).Build()
	return &CommandError{Code: codeDuplicateKey,
		Message: fmt.Sprintf("E11000 duplicate key error collection: %s.%s index: %s dup key: { %s }", c.db, c.name, ix.name, desc),
		info:    bson.Raw(info)}
}

func ordered(cmd *command) bool {
	if b, ok := cmd.body.Lookup("ordered").BooleanOK(); ok {
		return b
	}
	return true
}

// prepareInsert returns doc with _id as its first field, adding an ObjectID
// when missing.
func prepareInsert(doc bson.Raw) (bson.Raw, error) {
	first, err := doc.IndexErr(0)
	if err == nil && first.Key() == "_id" {
		return doc, checkID(first.Value())
	}
	idv, err := doc.LookupErr("_id")
	out := make([]byte, 0, len(doc)+17)
	idx, out := bsoncore.AppendDocumentStart(out)
	if err != nil {
		out = bsoncore.AppendObjectIDElement(out, "_id", bson.NewObjectID())
	} else {
		if err := checkID(idv); err != nil {
			return nil, err
		}
		out = bsoncore.AppendValueElement(out, "_id", bsoncore.Value{Type: bsoncore.Type(idv.Type), Data: idv.Value})
	}
	elems, _ := doc.Elements()
	for _, e := range elems {
		if e.Key() != "_id" {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return bson.Raw(out), nil
}

func checkID(v bson.RawValue) error {
	switch v.Type {
	case bson.TypeArray:
		return cmdErr(codeBadValue, "can't use an array for _id")
	case bson.TypeRegex:
		return cmdErr(codeBadValue, "can't use a regex for _id")
	case bson.TypeUndefined:
		return cmdErr(codeBadValue, "can't use a undefined for _id")
	}
	return nil
}

func docKeyOf(id bson.RawValue) bson.Raw {
	b := bsoncore.NewDocumentBuilder().AppendValue("_id", bsoncore.Value{Type: bsoncore.Type(id.Type), Data: id.Value}).Build()
	return bson.Raw(b)
}

// insertOne inserts into c; caller holds data.mu exclusively.
func (s *Server) insertOne(c *collection, doc bson.Raw) *CommandError {
	if len(doc) > maxBSONSize {
		return cmdErr(codeBadValue, "object to insert too large")
	}
	doc, err := prepareInsert(doc)
	if err != nil {
		var ce *CommandError
		errors.As(err, &ce)
		return ce
	}
	id, idv, _ := idKey(doc)
	if _, dup := c.byID[id]; dup {
		return dupKeyErr(c, c.indexes[0], doc)
	}
	if ix := c.checkUnique(doc, ""); ix != nil {
		return dupKeyErr(c, ix, doc)
	}
	c.insertDoc(id, doc)
	s.data.appendOp(&oplogEntry{op: opInsert, db: c.db, coll: c.name, docKey: docKeyOf(idv), post: doc, prePost: c.prePost})
	return nil
}

func (s *Server) cmdInsert(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	docs, err := cmd.docs("documents")
	if err != nil {
		return nil, err
	}
	ord := ordered(cmd)
	var werrs []writeError
	n := 0
	s.lockWrite(cmd)
	c, _ := s.data.ensureColl(cmd.db, name)
	for i, d := range docs {
		if ce := s.insertOne(c, d); ce != nil {
			werrs = append(werrs, writeError{index: i, err: ce})
			if ord {
				break
			}
			continue
		}
		n++
	}
	opTime := s.data.clock
	s.unlockWrite()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "n", int32(n))
	dst = appendWriteErrors(dst, werrs)
	return s.appendOKAt(dst, idx, opTime), nil
}

func appendWriteErrors(dst []byte, werrs []writeError) []byte {
	if len(werrs) == 0 {
		return dst
	}
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "writeErrors")
	for i, we := range werrs {
		eidx, d := bsoncore.AppendDocumentElementStart(dst, arrayKey(i))
		d = bsoncore.AppendInt32Element(d, "index", int32(we.index))
		d = bsoncore.AppendInt32Element(d, "code", we.err.Code)
		d = we.err.appendInfo(d)
		d = bsoncore.AppendStringElement(d, "errmsg", we.err.Message)
		dst, _ = bsoncore.AppendDocumentEnd(d, eidx)
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	return dst
}

// matching returns the live documents of c matching m, in natural order,
// at most limit of them (0: all).
func matching(c *collection, m matcher, limit int) []*docEntry {
	var out []*docEntry
	if c == nil {
		return nil
	}
	for _, e := range c.order {
		if e.dead || !m.Match(e.doc) {
			continue
		}
		out = append(out, e)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out
}

// matchingFast uses the _id index for {_id: <scalar>} filters.
func matchingFast(c *collection, filter bson.Raw, m matcher, limit int) []*docEntry {
	if c == nil {
		return nil
	}
	if elems, err := filter.Elements(); err == nil && len(elems) == 1 && elems[0].Key() == "_id" {
		v := elems[0].Value()
		if v.Type != bson.TypeEmbeddedDocument && v.Type != bson.TypeArray && v.Type != bson.TypeRegex && v.Type != bson.TypeNull {
			if e := c.byID[valueKey(v)]; e != nil {
				return []*docEntry{e}
			}
			return nil
		}
	}
	return matching(c, m, limit)
}

// updateResult is the outcome of one update statement.
type updateResult struct {
	matched, modified int
	upsertedID        *bson.RawValue
	before, after     bson.Raw // of the last document touched
}

// applyOne updates entry e of c with u (an update pipeline when pipeline);
// caller holds data.mu exclusively.
func (s *Server) applyOne(c *collection, e *docEntry, u bson.Raw, replacement, pipeline bool, now time.Time) (bson.Raw, bool, *CommandError) {
	old := e.doc
	var (
		newDoc  bson.Raw
		desc    *mql.UpdateDescription
		pipeUpd bson.Raw
	)
	if pipeline {
		nd, ud, err := applyPipelineUpdate(old, u, now)
		if err != nil {
			return nil, false, err
		}
		newDoc, pipeUpd = nd, ud
	} else if replacement {
		nd, err := prepareReplacement(old, u)
		if err != nil {
			return nil, false, err
		}
		newDoc = nd
	} else {
		nd, d, err := applyUpdate(old, u, false, now)
		if err != nil {
			return nil, false, queryErr(err)
		}
		newDoc, desc = nd, d
	}
	if bytes.Equal(old, newDoc) {
		return old, false, nil
	}
	if len(newDoc) > maxBSONSize {
		return nil, false, cmdErr(17419, "Resulting document after update is larger than 16777216")
	}
	if ix := c.checkUnique(newDoc, e.id); ix != nil {
		return nil, false, dupKeyErr(c, ix, newDoc)
	}
	c.replaceDoc(e, newDoc)
	idv := newDoc.Lookup("_id")
	ent := &oplogEntry{db: c.db, coll: c.name, docKey: docKeyOf(idv), pre: old, post: newDoc, prePost: c.prePost}
	switch {
	case replacement:
		ent.op = opReplace
	case pipeline:
		ent.op = opUpdate
		ent.upd = pipeUpd
	default:
		ent.op = opUpdate
		ent.upd = encodeUpdateDesc(desc)
	}
	s.data.appendOp(ent)
	return newDoc, true, nil
}

func encodeUpdateDesc(d *mql.UpdateDescription) bson.Raw {
	if d == nil {
		d = &mql.UpdateDescription{}
	}
	upd := d.UpdatedFields
	if upd == nil {
		upd = bson.D{}
	}
	rem := d.RemovedFields
	if rem == nil {
		rem = []string{}
	}
	tr := d.TruncatedArrays
	if tr == nil {
		tr = bson.A{}
	}
	b, err := bson.Marshal(bson.D{{Key: "updatedFields", Value: upd}, {Key: "removedFields", Value: rem}, {Key: "truncatedArrays", Value: tr}})
	if err != nil {
		b, _ = bson.Marshal(bson.D{{Key: "updatedFields", Value: bson.D{}}, {Key: "removedFields", Value: bson.A{}}, {Key: "truncatedArrays", Value: bson.A{}}})
	}
	return b
}

// prepareReplacement keeps old's _id first in the replacement document.
func prepareReplacement(old, repl bson.Raw) (bson.Raw, *CommandError) {
	oldID := old.Lookup("_id")
	if nid, err := repl.LookupErr("_id"); err == nil && !eqValue(nid, oldID) {
		return nil, cmdErr(codeImmutableField, "After applying the update, the (immutable) field '_id' was found to have been altered to _id: %s", nid)
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(repl)+len(oldID.Value)+8))
	out = bsoncore.AppendValueElement(out, "_id", bsoncore.Value{Type: bsoncore.Type(oldID.Type), Data: oldID.Value})
	elems, err := repl.Elements()
	if err != nil {
		return nil, cmdErr(codeBadValue, "%v", err)
	}
	for _, e := range elems {
		if e.Key() != "_id" {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return bson.Raw(out), nil
}

// upsertDoc builds the document an upsert inserts.
func upsertDoc(q, u bson.Raw, replacement, pipeline bool, now time.Time) (bson.Raw, *CommandError) {
	seed, err := upsertSeed(q)
	if err != nil {
		return nil, queryErr(err)
	}
	if pipeline {
		base, err := bson.Marshal(seed)
		if err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
		nd, _, ce := applyPipelineUpdate(base, u, now)
		if ce != nil {
			return nil, ce
		}
		d, err := prepareInsert(nd)
		if err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
		return d, nil
	}
	if replacement {
		if _, err := u.LookupErr("_id"); err != nil {
			for _, e := range seed {
				if e.Key == "_id" {
					b, _ := bson.Marshal(bson.D{e})
					d, _ := prepareReplacement(b, u)
					return d, nil
				}
			}
		}
		d, err := prepareInsert(u)
		if err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
		return d, nil
	}
	base, err := bson.Marshal(seed)
	if err != nil {
		return nil, cmdErr(codeBadValue, "%v", err)
	}
	nd, _, err := applyUpdate(base, u, true, now)
	if err != nil {
		return nil, queryErr(err)
	}
	d, err := prepareInsert(nd)
	if err != nil {
		return nil, cmdErr(codeBadValue, "%v", err)
	}
	return d, nil
}

// updateStmt runs one update statement, u being an update pipeline (a
// BSON array) when pipeline; now is the command's $$NOW. The caller holds
// data.mu exclusively.
func (s *Server) updateStmt(c *collection, q, u bson.Raw, pipeline, multi, upsert bool, order sorter, now time.Time) (updateResult, *CommandError) {
	var r updateResult
	replacement := !pipeline && isReplacement(u)
	if replacement && multi {
		return r, cmdErr(codeFailedToParse, "multi update is not supported for replacement-style update")
	}
	if !replacement && !pipeline {
		if len(u) <= 5 {
			return r, cmdErr(codeFailedToParse, "Update document requires atomic operators")
		}
	}
	m, err := compileFilterAt(q, now)
	if err != nil {
		return r, filterErr(err)
	}
	limit := 1
	if multi || order != nil {
		limit = 0
	}
	entries := matchingFast(c, q, m, limit)
	if order != nil && len(entries) > 1 {
		slices.SortStableFunc(entries, func(a, b *docEntry) int { return order.Compare(a.doc, b.doc) })
		if !multi {
			entries = entries[:1]
		}
	}
	for _, e := range entries {
		before := e.doc
		after, changed, ce := s.applyOne(c, e, u, replacement, pipeline, now)
		if ce != nil {
			return r, ce
		}
		r.matched++
		if changed {
			r.modified++
		}
		r.before, r.after = before, after
	}
	if len(entries) == 0 && upsert {
		doc, ce := upsertDoc(q, u, replacement, pipeline, now)
		if ce != nil {
			return r, ce
		}
		if ce := s.insertOne(c, doc); ce != nil {
			return r, ce
		}
		id := doc.Lookup("_id")
		r.upsertedID = &id
		r.after = doc
	}
	return r, nil
}

func (s *Server) cmdUpdate(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	stmts, err := cmd.docs("updates")
	if err != nil {
		return nil, err
	}
	ord := ordered(cmd)
	var (
		werrs    []writeError
		n, nMod  int
		upserted []bson.RawValue
		upIdx    []int
	)
	s.lockWrite(cmd)
	c, _ := s.data.ensureColl(cmd.db, name)
	now := s.data.nowFn() // $$NOW: one value per command
	for i, st := range stmts {
		q, _ := st.Lookup("q").DocumentOK()
		multi, _ := st.Lookup("multi").BooleanOK()
		upsert, _ := st.Lookup("upsert").BooleanOK()
		uv := st.Lookup("u")
		u, ok := uv.DocumentOK()
		pipeline := uv.Type == bson.TypeArray
		if pipeline {
			u, ok = bson.Raw(uv.Value), true
		}
		var (
			r  updateResult
			ce *CommandError
		)
		if !ok {
			ce = cmdErr(codeFailedToParse, "Update argument must be either an object or an array, not %s", uv.Type)
		} else {
			r, ce = s.updateStmt(c, q, u, pipeline, multi, upsert, nil, now)
		}
		if ce != nil {
			werrs = append(werrs, writeError{index: i, err: ce})
			if ord {
				break
			}
			continue
		}
		n += r.matched
		nMod += r.modified
		if r.upsertedID != nil {
			n++
			upserted = append(upserted, *r.upsertedID)
			upIdx = append(upIdx, i)
		}
	}
	opTime := s.data.clock
	s.unlockWrite()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "n", int32(n))
	dst = bsoncore.AppendInt32Element(dst, "nModified", int32(nMod))
	if len(upserted) > 0 {
		aidx, d := bsoncore.AppendArrayElementStart(dst, "upserted")
		for i, id := range upserted {
			eidx, dd := bsoncore.AppendDocumentElementStart(d, arrayKey(i))
			dd = bsoncore.AppendInt32Element(dd, "index", int32(upIdx[i]))
			dd = bsoncore.AppendValueElement(dd, "_id", bsoncore.Value{Type: bsoncore.Type(id.Type), Data: id.Value})
			d, _ = bsoncore.AppendDocumentEnd(dd, eidx)
		}
		dst, _ = bsoncore.AppendArrayEnd(d, aidx)
	}
	dst = appendWriteErrors(dst, werrs)
	return s.appendOKAt(dst, idx, opTime), nil
}

// deleteEntry removes e from c and records it; caller holds data.mu exclusively.
func (s *Server) deleteEntry(c *collection, e *docEntry) {
	old := e.doc
	c.deleteDoc(e)
	s.data.appendOp(&oplogEntry{op: opDelete, db: c.db, coll: c.name, docKey: docKeyOf(old.Lookup("_id")), pre: old, prePost: c.prePost})
}

func (s *Server) cmdDelete(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	stmts, err := cmd.docs("deletes")
	if err != nil {
		return nil, err
	}
	ord := ordered(cmd)
	var werrs []writeError
	n := 0
	s.lockWrite(cmd)
	c := s.data.coll(cmd.db, name)
	for i, st := range stmts {
		q, _ := st.Lookup("q").DocumentOK()
		limit := int(num(st.Lookup("limit")))
		m, err := compileFilter(q)
		if err != nil {
			werrs = append(werrs, writeError{index: i, err: filterErr(err)})
			if ord {
				break
			}
			continue
		}
		for _, e := range matchingFast(c, q, m, limit) {
			s.deleteEntry(c, e)
			n++
		}
	}
	opTime := s.data.clock
	s.unlockWrite()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "n", int32(n))
	dst = appendWriteErrors(dst, werrs)
	return s.appendOKAt(dst, idx, opTime), nil
}

func (s *Server) cmdFindAndModify(cmd *command, dst []byte) ([]byte, error) {
	cmd.name = "findAndModify"
	name, ok := cmd.body.Lookup(cmd.body.Index(0).Key()).StringValueOK()
	if !ok || !validCollName(name) {
		return nil, cmdErr(codeInvalidNamespace, "Invalid namespace")
	}
	q, _ := cmd.body.Lookup("query").DocumentOK()
	remove, _ := cmd.body.Lookup("remove").BooleanOK()
	returnNew, _ := cmd.body.Lookup("new").BooleanOK()
	upsert, _ := cmd.body.Lookup("upsert").BooleanOK()
	fields, _ := cmd.body.Lookup("fields").DocumentOK()
	uv, hasUpdate := cmd.body.Lookup("update"), false
	u, isDoc := uv.DocumentOK()
	hasUpdate = uv.Type != 0
	if remove == hasUpdate {
		return nil, cmdErr(codeFailedToParse, "Either an update or remove=true must be specified")
	}
	pipeline := uv.Type == bson.TypeArray
	if pipeline {
		u, isDoc = bson.Raw(uv.Value), true
	}
	if hasUpdate && !isDoc {
		return nil, cmdErr(codeFailedToParse, "Update argument must be either an object or an array")
	}
	var order sorter
	if sd, ok := cmd.body.Lookup("sort").DocumentOK(); ok && len(sd) > 5 {
		var err error
		if order, err = compileSort(sd); err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
	}
	s.lockWrite(cmd)
	now := s.data.nowFn() // $$NOW: one value per command
	var (
		value           bson.Raw
		n               int
		updatedExisting bool
		upsertedID      *bson.RawValue
	)
	if remove {
		c := s.data.coll(cmd.db, name)
		m, err := compileFilterAt(q, now)
		if err != nil {
			s.unlockWrite()
			return nil, filterErr(err)
		}
		entries := matchingFast(c, q, m, 0)
		if order != nil {
			slices.SortStableFunc(entries, func(a, b *docEntry) int { return order.Compare(a.doc, b.doc) })
		}
		if len(entries) > 0 {
			value = entries[0].doc
			s.deleteEntry(c, entries[0])
			n = 1
		}
	} else {
		c, _ := s.data.ensureColl(cmd.db, name)
		r, ce := s.updateStmt(c, q, u, pipeline, false, upsert, order, now)
		if ce != nil {
			s.unlockWrite()
			return nil, ce
		}
		switch {
		case r.upsertedID != nil:
			n, upsertedID = 1, r.upsertedID
			if returnNew {
				value = r.after
			}
		case r.matched > 0:
			n, updatedExisting = 1, true
			value = r.before
			if returnNew {
				value = r.after
			}
		}
	}
	opTime := s.data.clock
	s.unlockWrite()
	if value != nil && len(fields) > 5 {
		p, err := project(value, fields)
		if err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
		value = p
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	lidx, dst := bsoncore.AppendDocumentElementStart(dst, "lastErrorObject")
	dst = bsoncore.AppendInt32Element(dst, "n", int32(n))
	if !remove {
		dst = bsoncore.AppendBooleanElement(dst, "updatedExisting", updatedExisting)
		if upsertedID != nil {
			dst = bsoncore.AppendValueElement(dst, "upserted", bsoncore.Value{Type: bsoncore.Type(upsertedID.Type), Data: upsertedID.Value})
		}
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, lidx)
	if value != nil {
		dst = bsoncore.AppendDocumentElement(dst, "value", value)
	} else {
		dst = bsoncore.AppendNullElement(dst, "value")
	}
	return s.appendOKAt(dst, idx, opTime), nil
}

// queryDocs evaluates filter, sort, skip, limit and projection over a
// collection snapshot.
func (s *Server) queryDocs(cmd *command, db, coll string, filter, sortSpec, projection bson.Raw, skip, limit int) ([]bson.Raw, error) {
	m, err := compileFilter(filter)
	if err != nil {
		return nil, filterErr(err)
	}
	var order sorter
	if len(sortSpec) > 5 {
		if order, err = compileSort(sortSpec); err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
	}
	s.lockRead(cmd)
	c := s.data.coll(db, coll)
	var docs []bson.Raw
	if order == nil && skip == 0 && limit > 0 {
		for _, e := range matchingFast(c, filter, m, limit) {
			docs = append(docs, e.doc)
		}
	} else {
		for _, e := range matchingFast(c, filter, m, 0) {
			docs = append(docs, e.doc)
		}
	}
	s.unlockRead(cmd)
	if order != nil {
		slices.SortStableFunc(docs, order.Compare)
	}
	if skip > 0 {
		if skip >= len(docs) {
			docs = nil
		} else {
			docs = docs[skip:]
		}
	}
	if limit > 0 && len(docs) > limit {
		docs = docs[:limit]
	}
	if len(projection) > 5 {
		for i, d := range docs {
			p, err := project(d, projection)
			if err != nil {
				return nil, cmdErr(codeBadValue, "%v", err)
			}
			docs[i] = p
		}
	}
	return docs, nil
}

func intField(doc bson.Raw, key string) int {
	v, err := doc.LookupErr(key)
	if err != nil {
		return 0
	}
	return int(num(v))
}

func (s *Server) cmdFind(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	filter, _ := cmd.body.Lookup("filter").DocumentOK()
	sortSpec, _ := cmd.body.Lookup("sort").DocumentOK()
	projection, _ := cmd.body.Lookup("projection").DocumentOK()
	skip, limit := intField(cmd.body, "skip"), intField(cmd.body, "limit")
	single, _ := cmd.body.Lookup("singleBatch").BooleanOK()
	if limit < 0 {
		limit, single = -limit, true
	}
	batchSize := -1
	if _, err := cmd.body.LookupErr("batchSize"); err == nil {
		batchSize = intField(cmd.body, "batchSize")
	}
	docs, err := s.queryDocs(cmd, cmd.db, name, filter, sortSpec, projection, skip, limit)
	if err != nil {
		return nil, err
	}
	return s.replyDocs(cmd, dst, cmd.db+"."+name, docs, batchSize, single)
}

func (s *Server) cmdCount(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	q, _ := cmd.body.Lookup("query").DocumentOK()
	skip, limit := intField(cmd.body, "skip"), intField(cmd.body, "limit")
	if limit < 0 {
		limit = -limit
	}
	var n int
	if len(q) <= 5 {
		s.lockRead(cmd)
		if c := s.data.coll(cmd.db, name); c != nil {
			n = len(c.byID)
		}
		s.unlockRead(cmd)
		n = max(n-skip, 0)
		if limit > 0 {
			n = min(n, limit)
		}
	} else {
		docs, err := s.queryDocs(cmd, cmd.db, name, q, nil, nil, skip, limit)
		if err != nil {
			return nil, err
		}
		n = len(docs)
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "n", int32(n))
	return s.appendOK(dst, idx), nil
}

func (s *Server) cmdDistinct(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	key, _ := cmd.body.Lookup("key").StringValueOK()
	q, _ := cmd.body.Lookup("query").DocumentOK()
	docs, err := s.queryDocs(cmd, cmd.db, name, q, nil, nil, 0, 0)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var vals []bson.RawValue
	add := func(v bson.RawValue) {
		k := valueKey(v)
		if !seen[k] {
			seen[k] = true
			vals = append(vals, v)
		}
	}
	for _, d := range docs {
		for _, v := range lookupPath(d, key) {
			if v.Type == bson.TypeArray {
				elems, _ := bson.Raw(v.Value).Values()
				for _, e := range elems {
					add(e)
				}
				continue
			}
			add(v)
		}
	}
	slices.SortStableFunc(vals, compareValues)
	idx, dst := bsoncore.AppendDocumentStart(dst)
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "values")
	for i, v := range vals {
		dst = bsoncore.AppendValueElement(dst, arrayKey(i), bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	return s.appendOK(dst, idx), nil
}

// cursor is a server-side cursor: *docCursor or *streamCursor.
type cursor interface {
	namespace() string
}

// docCursor serves the remaining documents of a query.
type docCursor struct {
	mu   sync.Mutex
	ns   string
	docs []bson.Raw
}

func (c *docCursor) namespace() string { return c.ns }

func (s *Server) newCursorID() int64 {
	for {
		id := rand.Int64N(1<<62) + 1
		s.curMu.Lock()
		_, taken := s.cursors[id]
		s.curMu.Unlock()
		if !taken {
			return id
		}
	}
}

func (s *Server) registerCursor(c cursor) int64 {
	id := s.newCursorID()
	s.curMu.Lock()
	s.cursors[id] = c
	s.curMu.Unlock()
	return id
}

func (s *Server) dropCursor(id int64) {
	s.curMu.Lock()
	delete(s.cursors, id)
	s.curMu.Unlock()
}

// takeBatch splits off the next batch: batchSize documents (<0: no count
// limit) within maxBatchBytes.
func takeBatch(docs []bson.Raw, batchSize int) ([]bson.Raw, []bson.Raw) {
	size := 0
	n := 0
	for n < len(docs) && (batchSize < 0 || n < batchSize) {
		size += len(docs[n]) + 8
		if size > maxBatchBytes && n > 0 {
			break
		}
		n++
	}
	return docs[:n], docs[n:]
}

// replyDocs answers a cursor-returning command. batchSize < 0 means the
// default first batch of 101 documents.
func (s *Server) replyDocs(cmd *command, dst []byte, ns string, docs []bson.Raw, batchSize int, single bool) ([]byte, error) {
	if batchSize < 0 {
		batchSize = 101
	}
	if batchSize == 0 && single {
		batchSize = -1
	}
	first, rest := takeBatch(docs, batchSize)
	var id int64
	if len(rest) > 0 && !single {
		id = s.registerCursor(&docCursor{ns: ns, docs: rest})
	}
	return s.appendCursorReply(dst, "firstBatch", id, ns, first), nil
}

func (s *Server) appendCursorReply(dst []byte, batchKey string, id int64, ns string, docs []bson.Raw) []byte {
	idx, dst := bsoncore.AppendDocumentStart(dst)
	cidx, dst := bsoncore.AppendDocumentElementStart(dst, "cursor")
	aidx, dst := bsoncore.AppendArrayElementStart(dst, batchKey)
	for i, d := range docs {
		dst = bsoncore.AppendDocumentElement(dst, arrayKey(i), d)
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	dst = bsoncore.AppendInt64Element(dst, "id", id)
	dst = bsoncore.AppendStringElement(dst, "ns", ns)
	dst, _ = bsoncore.AppendDocumentEnd(dst, cidx)
	return s.appendOK(dst, idx)
}

func (s *Server) cmdGetMore(cmd *command, dst []byte) ([]byte, error) {
	idv := cmd.body.Lookup("getMore")
	id, ok := idv.Int64OK()
	if !ok {
		return nil, cmdErr(codeTypeMismatch, "Field 'getMore' must be of type long in: %s", cmd.body)
	}
	coll, _ := cmd.body.Lookup("collection").StringValueOK()
	s.curMu.Lock()
	cur := s.cursors[id]
	s.curMu.Unlock()
	if cur == nil {
		return nil, cmdErr(codeCursorNotFound, "cursor id %d not found", id)
	}
	if ns := cur.namespace(); ns != cmd.db+"."+coll {
		return nil, cmdErr(13, "Requested getMore on namespace '%s.%s', but cursor belongs to a different namespace %s", cmd.db, coll, ns)
	}
	batchSize := -1
	if _, err := cmd.body.LookupErr("batchSize"); err == nil {
		if batchSize = intField(cmd.body, "batchSize"); batchSize <= 0 {
			batchSize = -1
		}
	}
	switch c := cur.(type) {
	case *docCursor:
		c.mu.Lock()
		defer c.mu.Unlock()
		batch, rest := takeBatch(c.docs, batchSize)
		c.docs = rest
		if len(rest) == 0 {
			s.dropCursor(id)
			id = 0
		}
		return s.appendCursorReply(dst, "nextBatch", id, c.ns, batch), nil
	case *streamCursor:
		maxWait := time.Second
		if v, err := cmd.body.LookupErr("maxTimeMS"); err == nil {
			maxWait = time.Duration(num(v)) * time.Millisecond
		}
		return s.streamGetMore(cmd, dst, id, c, batchSize, maxWait)
	}
	return nil, cmdErr(codeInternalError, "unknown cursor type")
}

func (s *Server) cmdKillCursors(cmd *command, dst []byte) ([]byte, error) {
	arr, _ := cmd.body.Lookup("cursors").ArrayOK()
	vals, _ := arr.Values()
	var killed, notFound []int64
	s.curMu.Lock()
	for _, v := range vals {
		id, _ := v.AsInt64OK()
		if cur, ok := s.cursors[id]; ok {
			delete(s.cursors, id)
			killed = append(killed, id)
			if sc, ok := cur.(*streamCursor); ok {
				sc.kill() // interrupt a getMore waiting on it
			}
		} else {
			notFound = append(notFound, id)
		}
	}
	s.curMu.Unlock()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	for _, f := range []struct {
		key string
		ids []int64
	}{{"cursorsKilled", killed}, {"cursorsNotFound", notFound}, {"cursorsAlive", nil}, {"cursorsUnknown", nil}} {
		aidx, d := bsoncore.AppendArrayElementStart(dst, f.key)
		for i, id := range f.ids {
			d = bsoncore.AppendInt64Element(d, arrayKey(i), id)
		}
		dst, _ = bsoncore.AppendArrayEnd(d, aidx)
	}
	return s.appendOK(dst, idx), nil
}
