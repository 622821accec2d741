package event

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Txn is the transaction metadata of an event written by a multi-document
// transaction (a change carrying lsid and txnNumber); the envelope carries
// it as "txn": {"id", "index", "last"}. It is set by the source, which
// knows the events around it, and is immutable afterwards.
type Txn struct {
	// ID identifies the transaction: TxnID of the change. It is the same
	// for every event of the transaction, in every sink, source and
	// process.
	ID string
	// Index is the event's position among the events of the transaction
	// that its source reads: 0 for the first, then 1, 2, ... in stream
	// order (see source/txn.go for how it stays the same after a restart).
	Index int
	// Last marks the transaction's final event in its source's stream.
	Last bool
	// Unit is the unit of work whose source read the event (not in the
	// envelope): with partitions each unit numbers and ends its own share
	// of a transaction, and a grouped sink groups each share apart.
	Unit string
}

// TxnID returns the transaction id of a raw change (a BSON document): the first 16 bytes, in
// hex, of the SHA-256 of the session id (lsid.id, a UUID), the user hash
// (lsid.uid, empty when absent) and the txnNumber, each length-prefixed:
//
//	sha256( u32be(len(id)) ‖ id ‖ u32be(len(uid)) ‖ uid ‖ i64be(txnNumber) )[:16]
//
// where id and uid are the bytes of the binary values. A session whose
// lsid has no binary id hashes the whole lsid document instead of id and
// uid. It depends on the change alone, so it is the same across sinks,
// restarts and replays of a stored change. ok is false for a change
// without lsid and txnNumber (a single write, or a retryable write).
func TxnID(raw []byte) (id string, ok bool) {
	// One pass over the change (most have neither field).
	lv, lok, nv, nok := lookup2(raw, "lsid", "txnNumber")
	if !lok || lv.Type != bsoncore.TypeEmbeddedDocument || !nok {
		return "", false
	}
	var number int64
	switch nv.Type {
	case bsoncore.TypeInt64:
		number = nv.Int64()
	case bsoncore.TypeInt32:
		number = int64(nv.Int32())
	default:
		return "", false
	}
	lsid := bsoncore.Document(lv.Data)
	var sidBytes, uidBytes []byte
	if v, ok := lookup(lsid, "id"); ok && v.Type == bsoncore.TypeBinary {
		_, sidBytes, _ = v.BinaryOK()
		if u, ok := lookup(lsid, "uid"); ok && u.Type == bsoncore.TypeBinary {
			_, uidBytes, _ = u.BinaryOK()
		}
	} else {
		sidBytes = lsid
	}
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint32(n[:4], uint32(len(sidBytes)))
	h.Write(n[:4])
	h.Write(sidBytes)
	binary.BigEndian.PutUint32(n[:4], uint32(len(uidBytes)))
	h.Write(n[:4])
	h.Write(uidBytes)
	binary.BigEndian.PutUint64(n[:], uint64(number))
	h.Write(n[:])
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:16]), true
}

// TxnID returns TxnID(e.Raw). For an event made by FromChange from a
// change without the transaction fields (most changes) it answers without
// reading Raw again.
func (e *Event) TxnID() (id string, ok bool) {
	if e.noTxn {
		return "", false
	}
	return TxnID(e.Raw)
}

// appendTxnJSON appends {"id":…,"index":…} (and "last":true) to b.
func appendTxnJSON(b []byte, t *Txn) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, t.ID)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(t.Index), 10)
	if t.Last {
		b = append(b, `,"last":true`...)
	}
	return append(b, '}')
}

// JSON returns the transaction metadata as the envelope's "txn" object.
func (t *Txn) JSON() string { return string(appendTxnJSON(nil, t)) }

// TxnPartReserve is the most bytes MarkTxnPart adds to an envelope (parts
// below 10^9).
const TxnPartReserve = len(`,"part":999999999,"parts":999999999`)

// MarkTxnPart returns a copy of env, an encoded envelope or record of an
// event with transaction metadata t, whose "txn" object also says which part
// of a transaction split over several requests it is in:
// {"id":…,"index":…,"part":part,"parts":parts} (part counted from 1;
// "parts" left out when parts is 0: not known yet). It returns env itself
// when env does not hold t's "txn" object.
func MarkTxnPart(env []byte, t *Txn, part, parts int) []byte {
	obj := appendTxnJSON([]byte(`"txn":`), t)
	at := bytes.Index(env, obj)
	if at < 0 {
		return env
	}
	end := at + len(obj) - 1 // the object's closing brace
	out := make([]byte, 0, len(env)+TxnPartReserve)
	out = append(out, env[:end]...)
	out = append(out, `,"part":`...)
	out = strconv.AppendInt(out, int64(part), 10)
	if parts > 0 {
		out = append(out, `,"parts":`...)
		out = strconv.AppendInt(out, int64(parts), 10)
	}
	return append(out, env[end:]...)
}
