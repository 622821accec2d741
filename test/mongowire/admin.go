package mongowire

import (
	"crypto/rand"
	"math"
	"sort"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Version information reported by buildInfo and hello.
const (
	serverVersion  = "7.0.0"
	maxWireVersion = 21
)

// dispatch runs a command, appending its reply document to dst.
func (s *Server) dispatch(cmd *command, dst []byte) ([]byte, error) {
	switch cmd.name {
	case "commitTransaction":
		return s.cmdCommitTransaction(cmd, dst)
	case "abortTransaction":
		return s.cmdAbortTransaction(cmd, dst)
	}
	if inTxn(cmd) {
		return s.dispatchInTxn(cmd, dst)
	}
	return s.dispatchCmd(cmd, dst)
}

// dispatchCmd runs a command (in cmd.txn if set).
func (s *Server) dispatchCmd(cmd *command, dst []byte) ([]byte, error) {
	switch cmd.name {
	case "hello", "isMaster", "ismaster":
		return s.cmdHello(cmd, dst)
	case "ping":
		idx, dst := bsoncore.AppendDocumentStart(dst)
		return s.appendOK(dst, idx), nil
	case "buildInfo", "buildinfo":
		return s.cmdBuildInfo(dst)
	case "endSessions", "killSessions", "killAllSessions":
		return s.cmdEndSessions(cmd, dst)
	case "refreshSessions", "getLastError", "resetError":
		idx, dst := bsoncore.AppendDocumentStart(dst)
		return s.appendOK(dst, idx), nil
	case "startSession":
		return s.cmdStartSession(dst)
	case "getParameter", "getCmdLineOpts", "serverStatus", "hostInfo", "connectionStatus", "whatsmyuri", "getFreeMonitoringStatus":
		return s.cmdInfo(cmd, dst)
	case "listDatabases":
		return s.cmdListDatabases(cmd, dst)
	case "listCollections":
		return s.cmdListCollections(cmd, dst)
	case "create":
		return s.cmdCreate(cmd, dst)
	case "collMod":
		return s.cmdCollMod(cmd, dst)
	case "drop":
		return s.cmdDrop(cmd, dst)
	case "dropDatabase":
		return s.cmdDropDatabase(cmd, dst)
	case "renameCollection":
		return s.cmdRename(cmd, dst)
	case "createIndexes":
		return s.cmdCreateIndexes(cmd, dst)
	case "listIndexes":
		return s.cmdListIndexes(cmd, dst)
	case "dropIndexes", "deleteIndexes":
		return s.cmdDropIndexes(cmd, dst)
	case "insert", "update", "delete", "findAndModify", "findandmodify":
		return s.retryableWrite(cmd, dst)
	case "find":
		return s.cmdFind(cmd, dst)
	case "count":
		return s.cmdCount(cmd, dst)
	case "distinct":
		return s.cmdDistinct(cmd, dst)
	case "aggregate":
		return s.cmdAggregate(cmd, dst)
	case "getMore":
		return s.cmdGetMore(cmd, dst)
	case "killCursors":
		return s.cmdKillCursors(cmd, dst)
	case "configureFailPoint":
		return s.cmdConfigureFailPoint(cmd, dst)
	}
	return nil, cmdErr(codeCommandNotFound, "no such command: '%s'", cmd.name)
}

func (s *Server) cmdHello(cmd *command, dst []byte) ([]byte, error) {
	if client, ok := cmd.body.Lookup("client").DocumentOK(); ok {
		if name, ok := client.Lookup("application", "name").StringValueOK(); ok {
			cmd.conn.appName = name
		}
	}
	host := cmd.conn.nc.LocalAddr().String()
	now := time.Now()
	last := s.data.clusterTime()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	if h, _ := cmd.body.Lookup("helloOk").BooleanOK(); h {
		dst = bsoncore.AppendBooleanElement(dst, "helloOk", true)
	}
	if cmd.name == "hello" {
		dst = bsoncore.AppendBooleanElement(dst, "isWritablePrimary", true)
	} else {
		dst = bsoncore.AppendBooleanElement(dst, "ismaster", true)
	}
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "hosts")
	dst = bsoncore.AppendStringElement(dst, "0", host)
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	dst = bsoncore.AppendStringElement(dst, "setName", s.opts.ReplicaSetName)
	dst = bsoncore.AppendInt32Element(dst, "setVersion", 1)
	dst = bsoncore.AppendBooleanElement(dst, "secondary", false)
	dst = bsoncore.AppendStringElement(dst, "primary", host)
	dst = bsoncore.AppendStringElement(dst, "me", host)
	lidx, dst := bsoncore.AppendDocumentElementStart(dst, "lastWrite")
	for _, k := range []string{"opTime", "majorityOpTime"} {
		oidx, d := bsoncore.AppendDocumentElementStart(dst, k)
		d = bsoncore.AppendTimestampElement(d, "ts", last.T, last.I)
		d = bsoncore.AppendInt64Element(d, "t", 1)
		dst, _ = bsoncore.AppendDocumentEnd(d, oidx)
	}
	dst = bsoncore.AppendDateTimeElement(dst, "lastWriteDate", int64(last.T)*1000)
	dst = bsoncore.AppendDateTimeElement(dst, "majorityWriteDate", int64(last.T)*1000)
	dst, _ = bsoncore.AppendDocumentEnd(dst, lidx)
	dst = bsoncore.AppendInt32Element(dst, "maxBsonObjectSize", maxBSONSize)
	dst = bsoncore.AppendInt32Element(dst, "maxMessageSizeBytes", maxMessageSize)
	dst = bsoncore.AppendInt32Element(dst, "maxWriteBatchSize", 100000)
	dst = bsoncore.AppendDateTimeElement(dst, "localTime", now.UnixMilli())
	dst = bsoncore.AppendInt32Element(dst, "logicalSessionTimeoutMinutes", 30)
	dst = bsoncore.AppendInt32Element(dst, "connectionId", cmd.conn.id)
	dst = bsoncore.AppendInt32Element(dst, "minWireVersion", 0)
	dst = bsoncore.AppendInt32Element(dst, "maxWireVersion", maxWireVersion)
	dst = bsoncore.AppendBooleanElement(dst, "readOnly", false)
	dst = s.appendTopologyVersion(dst)
	return s.appendOK(dst, idx), nil
}

func (s *Server) cmdBuildInfo(dst []byte) ([]byte, error) {
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendStringElement(dst, "version", serverVersion)
	dst = bsoncore.AppendStringElement(dst, "gitVersion", "mongowire")
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "versionArray")
	for i, v := range []int32{7, 0, 0, 0} {
		dst = bsoncore.AppendInt32Element(dst, arrayKey(i), v)
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	aidx, dst = bsoncore.AppendArrayElementStart(dst, "storageEngines")
	dst = bsoncore.AppendStringElement(dst, "0", "inMemory")
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	dst = bsoncore.AppendInt32Element(dst, "bits", 64)
	dst = bsoncore.AppendBooleanElement(dst, "debug", false)
	dst = bsoncore.AppendInt32Element(dst, "maxBsonObjectSize", maxBSONSize)
	return s.appendOK(dst, idx), nil
}

func (s *Server) cmdStartSession(dst []byte) ([]byte, error) {
	var id [16]byte
	_, _ = rand.Read(id[:])
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	idx, dst := bsoncore.AppendDocumentStart(dst)
	iidx, dst := bsoncore.AppendDocumentElementStart(dst, "id")
	dst = bsoncore.AppendBinaryElement(dst, "id", 4, id[:])
	dst, _ = bsoncore.AppendDocumentEnd(dst, iidx)
	dst = bsoncore.AppendInt32Element(dst, "timeoutMinutes", 30)
	return s.appendOK(dst, idx), nil
}

// cmdInfo answers diagnostic commands with a minimal but well-formed reply.
func (s *Server) cmdInfo(cmd *command, dst []byte) ([]byte, error) {
	idx, dst := bsoncore.AppendDocumentStart(dst)
	switch cmd.name {
	case "serverStatus":
		dst = bsoncore.AppendStringElement(dst, "host", cmd.conn.nc.LocalAddr().String())
		dst = bsoncore.AppendStringElement(dst, "version", serverVersion)
		dst = bsoncore.AppendStringElement(dst, "process", "mongod")
		dst = bsoncore.AppendDateTimeElement(dst, "localTime", time.Now().UnixMilli())
	case "whatsmyuri":
		dst = bsoncore.AppendStringElement(dst, "you", cmd.conn.nc.RemoteAddr().String())
	case "connectionStatus":
		aidx, d := bsoncore.AppendDocumentElementStart(dst, "authInfo")
		d = bsoncore.AppendArrayElement(d, "authenticatedUsers", emptyArray)
		d = bsoncore.AppendArrayElement(d, "authenticatedUserRoles", emptyArray)
		dst, _ = bsoncore.AppendDocumentEnd(d, aidx)
	}
	return s.appendOK(dst, idx), nil
}

var emptyArray = []byte{5, 0, 0, 0, 0}

func (s *Server) cmdListDatabases(cmd *command, dst []byte) ([]byte, error) {
	nameOnly, _ := cmd.body.Lookup("nameOnly").BooleanOK()
	var filter matcher = matchAll{}
	if f, ok := cmd.body.Lookup("filter").DocumentOK(); ok {
		var err error
		if filter, err = compileFilter(f); err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
	}
	s.data.mu.RLock()
	names := []string{"admin", "config", "local"}
	sizes := map[string]int64{}
	for name, d := range s.data.dbs {
		if len(d.colls) == 0 {
			continue
		}
		var size int64
		for _, c := range d.colls {
			for _, e := range c.order {
				if !e.dead {
					size += int64(len(e.doc))
				}
			}
		}
		sizes[name] = size
		if name != "admin" && name != "config" && name != "local" {
			names = append(names, name)
		}
	}
	s.data.mu.RUnlock()
	sort.Strings(names)
	idx, dst := bsoncore.AppendDocumentStart(dst)
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "databases")
	var total int64
	n := 0
	for _, name := range names {
		size := sizes[name] + 4096
		b := bsoncore.NewDocumentBuilder().AppendString("name", name)
		if !nameOnly {
			b.AppendInt64("sizeOnDisk", size).AppendBoolean("empty", false)
		}
		doc := b.Build()
		if !filter.Match(bson.Raw(doc)) {
			continue
		}
		total += size
		dst = bsoncore.AppendDocumentElement(dst, arrayKey(n), doc)
		n++
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, aidx)
	if !nameOnly {
		dst = bsoncore.AppendInt64Element(dst, "totalSize", total)
		dst = bsoncore.AppendInt64Element(dst, "totalSizeMb", total>>20)
	}
	return s.appendOK(dst, idx), nil
}

func validCollName(name string) bool {
	return name != "" && !strings.HasPrefix(name, "$") && !strings.ContainsRune(name, 0)
}

func (s *Server) collName(cmd *command) (string, error) {
	name, ok := cmd.body.Lookup(cmd.name).StringValueOK()
	if !ok {
		return "", cmdErr(codeInvalidNamespace, "collection name has invalid type %s", cmd.body.Lookup(cmd.name).Type)
	}
	if !validCollName(name) {
		return "", cmdErr(codeInvalidNamespace, "Invalid namespace specified '%s.%s'", cmd.db, name)
	}
	return name, nil
}

func (s *Server) cmdListCollections(cmd *command, dst []byte) ([]byte, error) {
	nameOnly, _ := cmd.body.Lookup("nameOnly").BooleanOK()
	var filter matcher = matchAll{}
	if f, ok := cmd.body.Lookup("filter").DocumentOK(); ok {
		var err error
		if filter, err = compileFilter(f); err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
	}
	var docs []bson.Raw
	s.data.mu.RLock()
	if d := s.data.dbs[cmd.db]; d != nil {
		names := make([]string, 0, len(d.colls))
		for n := range d.colls {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			c := d.colls[n]
			b := bsoncore.NewDocumentBuilder().AppendString("name", n).AppendString("type", "collection")
			if !nameOnly {
				opts := bsoncore.NewDocumentBuilder()
				if c.prePost {
					opts.AppendDocument("changeStreamPreAndPostImages", bsoncore.NewDocumentBuilder().AppendBoolean("enabled", true).Build())
				}
				b.AppendDocument("options", opts.Build())
				b.AppendDocument("info", bsoncore.NewDocumentBuilder().AppendBoolean("readOnly", false).AppendBinary("uuid", 4, c.uuid[:]).Build())
				b.AppendDocument("idIndex", bsoncore.NewDocumentBuilder().AppendInt32("v", 2).
					AppendDocument("key", bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).AppendString("name", "_id_").Build())
			}
			doc := bson.Raw(b.Build())
			if filter.Match(doc) {
				docs = append(docs, doc)
			}
		}
	}
	s.data.mu.RUnlock()
	return s.replyCursor(cmd, dst, cmd.db+".$cmd.listCollections", docs)
}

// replyCursor answers with the first batch of docs and parks the rest in a
// new cursor.
func (s *Server) replyCursor(cmd *command, dst []byte, ns string, docs []bson.Raw) ([]byte, error) {
	batchSize := -1
	if cur, ok := cmd.body.Lookup("cursor").DocumentOK(); ok {
		if v, err := cur.LookupErr("batchSize"); err == nil {
			batchSize = int(num(v))
		}
	}
	return s.replyDocs(cmd, dst, ns, docs, batchSize, false)
}

func (s *Server) cmdCreate(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	prePost := false
	if cs, ok := cmd.body.Lookup("changeStreamPreAndPostImages").DocumentOK(); ok {
		prePost, _ = cs.Lookup("enabled").BooleanOK()
	}
	s.lockWrite(cmd)
	c, created := s.data.ensureColl(cmd.db, name)
	if created {
		c.prePost = prePost
	}
	s.unlockWrite()
	if !created {
		return nil, cmdErr(codeNamespaceExists, "Collection %s.%s already exists.", cmd.db, name)
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	return s.appendOK(dst, idx), nil
}

func (s *Server) cmdCollMod(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	s.data.mu.Lock()
	defer s.data.mu.Unlock()
	c := s.data.coll(cmd.db, name)
	if c == nil {
		return nil, cmdErr(codeNamespaceNotFound, "ns does not exist: %s.%s", cmd.db, name)
	}
	if cs, ok := cmd.body.Lookup("changeStreamPreAndPostImages").DocumentOK(); ok {
		c.prePost, _ = cs.Lookup("enabled").BooleanOK()
	}
	var ttlOld, ttlNew bson.RawValue
	if spec, ok := cmd.body.Lookup("index").DocumentOK(); ok {
		// {index: {name | keyPattern, expireAfterSeconds}}: change a TTL.
		var ix *index
		for _, x := range c.indexes {
			if n, ok := spec.Lookup("name").StringValueOK(); ok && x.name == n {
				ix = x
			}
			if k, ok := spec.Lookup("keyPattern").DocumentOK(); ok && string(x.key) == string(k) {
				ix = x
			}
		}
		if ix == nil {
			return nil, cmdErr(codeIndexNotFound, "cannot find index %s for ns %s.%s", spec, cmd.db, name)
		}
		if ttl, err := spec.LookupErr("expireAfterSeconds"); err == nil {
			if ix.ttl.Type == 0 {
				return nil, cmdErr(codeInvalidOptions, "no expireAfterSeconds field to update")
			}
			if _, err := indexTTL(spec, ix.key); err != nil {
				return nil, err
			}
			ttlOld, ttlNew = ix.ttl, ttl
			ix.spec = newIndex(ix.name, ix.key, ix.unique, ix.sparse).withTTL(ttl).spec
			ix.ttl = ttl
		}
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	if ttlNew.Type != 0 {
		dst = bsoncore.AppendValueElement(dst, "expireAfterSeconds_old", bsoncore.Value{Type: bsoncore.Type(ttlOld.Type), Data: ttlOld.Value})
		dst = bsoncore.AppendValueElement(dst, "expireAfterSeconds_new", bsoncore.Value{Type: bsoncore.Type(ttlNew.Type), Data: ttlNew.Value})
	}
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	dst = s.appendTimes(dst, s.data.clock)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, nil
}

// dropColl removes a collection and records a drop; caller holds data.mu.
func (s *Server) dropColl(db, name string) bool {
	d := s.data.dbs[db]
	if d == nil || d.colls[name] == nil {
		return false
	}
	delete(d.colls, name)
	if len(d.colls) == 0 {
		delete(s.data.dbs, db)
	}
	s.data.appendOp(&oplogEntry{op: opDrop, db: db, coll: name})
	return true
}

func (s *Server) cmdDrop(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	s.data.mu.Lock()
	nIdx := 0
	if c := s.data.coll(cmd.db, name); c != nil {
		nIdx = len(c.indexes)
	}
	dropped := s.dropColl(cmd.db, name)
	opTime := s.data.clock
	s.data.mu.Unlock()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	if dropped {
		dst = bsoncore.AppendInt32Element(dst, "nIndexesWas", int32(nIdx))
		dst = bsoncore.AppendStringElement(dst, "ns", cmd.db+"."+name)
	}
	return s.appendOKAt(dst, idx, opTime), nil
}

func (s *Server) cmdDropDatabase(cmd *command, dst []byte) ([]byte, error) {
	s.data.mu.Lock()
	if d := s.data.dbs[cmd.db]; d != nil {
		names := make([]string, 0, len(d.colls))
		for n := range d.colls {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			s.dropColl(cmd.db, n)
		}
		delete(s.data.dbs, cmd.db)
		s.data.appendOp(&oplogEntry{op: opDropDatabase, db: cmd.db})
	}
	opTime := s.data.clock
	s.data.mu.Unlock()
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendStringElement(dst, "dropped", cmd.db)
	return s.appendOKAt(dst, idx, opTime), nil
}

func (s *Server) cmdRename(cmd *command, dst []byte) ([]byte, error) {
	if cmd.db != "admin" {
		return nil, cmdErr(13, "renameCollection may only be run against the admin database.")
	}
	from, _ := cmd.body.Lookup("renameCollection").StringValueOK()
	to, _ := cmd.body.Lookup("to").StringValueOK()
	dropTarget, _ := cmd.body.Lookup("dropTarget").BooleanOK()
	fdb, fcoll, ok1 := cutDot(from)
	tdb, tcoll, ok2 := cutDot(to)
	if !ok1 || !ok2 || !validCollName(fcoll) || !validCollName(tcoll) {
		return nil, cmdErr(codeInvalidNamespace, "Invalid namespace specified '%s' or '%s'", from, to)
	}
	s.data.mu.Lock()
	defer s.data.mu.Unlock()
	src := s.data.coll(fdb, fcoll)
	if src == nil {
		return nil, cmdErr(codeNamespaceNotFound, "Source collection %s does not exist", from)
	}
	if from == to {
		return nil, cmdErr(codeIllegalOperation, "Can't rename a collection to itself")
	}
	if s.data.coll(tdb, tcoll) != nil {
		if !dropTarget {
			return nil, cmdErr(codeNamespaceExists, "Collection %s already exists.", to)
		}
		s.dropColl(tdb, tcoll)
	}
	delete(s.data.dbs[fdb].colls, fcoll)
	if len(s.data.dbs[fdb].colls) == 0 {
		delete(s.data.dbs, fdb)
	}
	dstColl, _ := s.data.ensureColl(tdb, tcoll)
	*dstColl = *src
	dstColl.db, dstColl.name = tdb, tcoll
	s.data.appendOp(&oplogEntry{op: opRename, db: fdb, coll: fcoll, toDB: tdb, toColl: tcoll})
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	dst = s.appendTimes(dst, s.data.clock)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, nil
}

func (s *Server) cmdCreateIndexes(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	specs, err := cmd.docs("indexes")
	if err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		return nil, cmdErr(codeBadValue, "Must specify at least one index to create")
	}
	s.lockWrite(cmd)
	defer s.unlockWrite()
	c, created := s.data.ensureColl(cmd.db, name)
	before := len(c.indexes)
	for _, spec := range specs {
		key, ok := spec.Lookup("key").DocumentOK()
		if !ok || len(key) <= 5 {
			return nil, cmdErr(codeFailedToParse, "Index key pattern must be a non-empty object")
		}
		iname, ok := spec.Lookup("name").StringValueOK()
		if !ok {
			return nil, cmdErr(codeFailedToParse, "Error in specification: the 'name' field is a required property of an index specification")
		}
		unique, _ := spec.Lookup("unique").BooleanOK()
		sparse, _ := spec.Lookup("sparse").BooleanOK()
		ttl, err := indexTTL(spec, key)
		if err != nil {
			return nil, err
		}
		var existing *index
		for _, ix := range c.indexes {
			if ix.name == iname || string(ix.key) == string(key) {
				existing = ix
			}
		}
		if existing != nil {
			if existing.name == iname && string(existing.key) != string(key) {
				return nil, cmdErr(codeIndexKeySpecsConflict, "An existing index has the same name as the requested index but different key: %s", iname)
			}
			if existing.name != iname || existing.unique != unique && iname != "_id_" {
				return nil, cmdErr(codeIndexOptionsConflict, "Index already exists with a different name or options: %s", existing.name)
			}
			if existing.ttl.Type != ttl.Type || ttl.Type != 0 && num(existing.ttl) != num(ttl) {
				return nil, cmdErr(codeIndexOptionsConflict, "An equivalent index already exists with the same name but different options. Requested index: %s, existing index: %s", spec, existing.spec)
			}
			continue
		}
		ix := newIndex(iname, key, unique, sparse)
		if ttl.Type != 0 {
			ix.withTTL(ttl)
		}
		if unique {
			for _, e := range c.order {
				if e.dead {
					continue
				}
				k, ok := ix.indexKey(e.doc)
				if !ok {
					continue
				}
				if _, dup := ix.entries[k]; dup {
					return nil, dupKeyErr(c, ix, e.doc)
				}
				ix.entries[k] = e.id
			}
		}
		c.indexes = append(c.indexes, ix)
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "numIndexesBefore", int32(before))
	dst = bsoncore.AppendInt32Element(dst, "numIndexesAfter", int32(len(c.indexes)))
	dst = bsoncore.AppendBooleanElement(dst, "createdCollectionAutomatically", created)
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	dst = s.appendTimes(dst, s.data.clock)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, nil
}

// indexTTL returns the expireAfterSeconds of an index spec (Type 0 when
// absent), refusing what MongoDB refuses (index_key_validate.cpp): a value
// that is not a number, one outside 0..2147483647, and a TTL on a compound
// key.
func indexTTL(spec, key bson.Raw) (bson.RawValue, error) {
	ttl, err := spec.LookupErr("expireAfterSeconds")
	if err != nil {
		return bson.RawValue{}, nil
	}
	if !ttl.IsNumber() {
		return bson.RawValue{}, cmdErr(codeCannotCreateIndex, "TTL index 'expireAfterSeconds' option must be numeric, but received a type of '%s'. Index spec: %s", typeName(ttl.Type), spec)
	}
	if n := num(ttl); n < 0 || n > math.MaxInt32 {
		return bson.RawValue{}, cmdErr(codeCannotCreateIndex, "TTL index 'expireAfterSeconds' option must be within an acceptable range, try a lower number. Index spec: %s", spec)
	}
	if elems, _ := key.Elements(); len(elems) > 1 {
		return bson.RawValue{}, cmdErr(codeCannotCreateIndex, "TTL indexes are single-field indexes, compound indexes do not support TTL. Index spec: %s", spec)
	}
	return ttl, nil
}

func (s *Server) cmdListIndexes(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	s.data.mu.RLock()
	c := s.data.coll(cmd.db, name)
	var docs []bson.Raw
	if c != nil {
		for _, ix := range c.indexes {
			docs = append(docs, ix.spec)
		}
	}
	s.data.mu.RUnlock()
	if c == nil {
		return nil, cmdErr(codeNamespaceNotFound, "ns does not exist: %s.%s", cmd.db, name)
	}
	return s.replyCursor(cmd, dst, cmd.db+".$cmd.listIndexes."+name, docs)
}

func (s *Server) cmdDropIndexes(cmd *command, dst []byte) ([]byte, error) {
	name, err := s.collName(cmd)
	if err != nil {
		return nil, err
	}
	s.data.mu.Lock()
	defer s.data.mu.Unlock()
	c := s.data.coll(cmd.db, name)
	if c == nil {
		return nil, cmdErr(codeNamespaceNotFound, "ns not found %s.%s", cmd.db, name)
	}
	before := len(c.indexes)
	target := cmd.body.Lookup("index")
	keep := c.indexes[:1]
	found := false
	for _, ix := range c.indexes[1:] {
		match := false
		switch target.Type {
		case bson.TypeString:
			match = target.StringValue() == "*" || target.StringValue() == ix.name
		case bson.TypeEmbeddedDocument:
			match = string(target.Value) == string(ix.key)
		case bson.TypeArray:
			vals, _ := target.Array().Values()
			for _, v := range vals {
				match = match || v.StringValue() == ix.name
			}
		}
		if match {
			found = true
		} else {
			keep = append(keep, ix)
		}
	}
	if !found && !(target.Type == bson.TypeString && target.StringValue() == "*") {
		return nil, cmdErr(codeIndexNotFound, "index not found with name [%v]", target)
	}
	c.indexes = keep
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "nIndexesWas", int32(before))
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	dst = s.appendTimes(dst, s.data.clock)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, nil
}
