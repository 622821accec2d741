package mongowire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Wire protocol opcodes (https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/).
const (
	opReply      = 1
	opQuery      = 2004
	opCompressed = 2012
	opMsg        = 2013
)

// OP_MSG flag bits.
const (
	flagChecksumPresent = 1 << 0
	flagMoreToCome      = 1 << 1
	flagExhaustAllowed  = 1 << 16
)

const (
	headerLen = 16
	// maxMessageSize is the largest message accepted, advertised as maxMessageSizeBytes.
	maxMessageSize = 48000000
	// maxBSONSize is the largest document, advertised as maxBsonObjectSize.
	maxBSONSize = 16 * 1024 * 1024
	// maxBatchBytes bounds the documents of one cursor batch, like the server's 16 MiB.
	maxBatchBytes = maxBSONSize - 64*1024
)

// message is one decoded request.
type message struct {
	requestID int32
	opCode    int32
	flags     uint32 // OP_MSG flag bits
	// body is the kind-0 section (OP_MSG) or the query document (OP_QUERY).
	body bson.Raw
	// seqs holds the kind-1 document sequences by identifier, in arrival order.
	seqs []docSequence
	// fullCollectionName is OP_QUERY's target, e.g. "admin.$cmd".
	fullCollectionName string
}

type docSequence struct {
	id   string
	docs []bson.Raw
}

var errBadMessage = errors.New("malformed message")

// readMessage reads one message. The returned message owns its memory.
func readMessage(r *bufio.Reader) (*message, error) {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	length := int32(binary.LittleEndian.Uint32(hdr[0:]))
	if length < headerLen || length > maxMessageSize {
		return nil, fmt.Errorf("%w: length %d", errBadMessage, length)
	}
	m := &message{
		requestID: int32(binary.LittleEndian.Uint32(hdr[4:])),
		opCode:    int32(binary.LittleEndian.Uint32(hdr[12:])),
	}
	buf := make([]byte, length-headerLen)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	switch m.opCode {
	case opMsg:
		return m, parseOpMsg(m, buf)
	case opQuery:
		return m, parseOpQuery(m, buf)
	default:
		return m, fmt.Errorf("%w: unsupported opcode %d", errBadMessage, m.opCode)
	}
}

func readDoc(b []byte) (bson.Raw, []byte, error) {
	if len(b) < 5 {
		return nil, nil, errBadMessage
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 5 || n > len(b) || b[n-1] != 0 {
		return nil, nil, errBadMessage
	}
	return bson.Raw(b[:n:n]), b[n:], nil
}

func readCString(b []byte) (string, []byte, error) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], nil
		}
	}
	return "", nil, errBadMessage
}

func parseOpMsg(m *message, b []byte) error {
	if len(b) < 4 {
		return errBadMessage
	}
	m.flags = binary.LittleEndian.Uint32(b)
	b = b[4:]
	if m.flags&flagChecksumPresent != 0 {
		if len(b) < 4 {
			return errBadMessage
		}
		b = b[:len(b)-4]
	}
	for len(b) > 0 {
		kind := b[0]
		b = b[1:]
		switch kind {
		case 0:
			doc, rest, err := readDoc(b)
			if err != nil {
				return err
			}
			if m.body != nil {
				return fmt.Errorf("%w: two kind-0 sections", errBadMessage)
			}
			m.body, b = doc, rest
		case 1:
			if len(b) < 4 {
				return errBadMessage
			}
			size := int(binary.LittleEndian.Uint32(b))
			if size < 4 || size > len(b) {
				return errBadMessage
			}
			sec := b[4:size]
			b = b[size:]
			id, sec, err := readCString(sec)
			if err != nil {
				return err
			}
			seq := docSequence{id: id}
			for len(sec) > 0 {
				var doc bson.Raw
				doc, sec, err = readDoc(sec)
				if err != nil {
					return err
				}
				seq.docs = append(seq.docs, doc)
			}
			m.seqs = append(m.seqs, seq)
		default:
			return fmt.Errorf("%w: section kind %d", errBadMessage, kind)
		}
	}
	if m.body == nil {
		return fmt.Errorf("%w: no kind-0 section", errBadMessage)
	}
	return nil
}

func parseOpQuery(m *message, b []byte) error {
	if len(b) < 4 {
		return errBadMessage
	}
	b = b[4:] // flags
	name, b, err := readCString(b)
	if err != nil {
		return err
	}
	m.fullCollectionName = name
	if len(b) < 8 {
		return errBadMessage
	}
	b = b[8:] // numberToSkip, numberToReturn
	doc, _, err := readDoc(b)
	if err != nil {
		return err
	}
	// Drivers may wrap the command as {$query: {...}, $readPreference: ...}.
	if q, ok := doc.Lookup("$query").DocumentOK(); ok {
		doc = q
	}
	m.body = doc
	return nil
}

// msgWriter builds one OP_MSG or OP_REPLY in place: reply documents are appended
// straight into the frame so a batch is encoded exactly once.
type msgWriter struct {
	buf []byte
}

// startMsg begins an OP_MSG reply with one kind-0 section; the body document
// is then appended to w.buf by the caller.
func (w *msgWriter) startMsg(responseTo int32) {
	w.buf = w.buf[:0]
	w.buf = append(w.buf, make([]byte, headerLen)...)
	binary.LittleEndian.PutUint32(w.buf[8:], uint32(responseTo))
	binary.LittleEndian.PutUint32(w.buf[12:], opMsg)
	w.buf = append(w.buf, 0, 0, 0, 0, 0) // flagBits, section kind 0
}

// startReply begins an OP_REPLY carrying exactly one document.
func (w *msgWriter) startReply(responseTo int32) {
	w.buf = w.buf[:0]
	w.buf = append(w.buf, make([]byte, headerLen)...)
	binary.LittleEndian.PutUint32(w.buf[8:], uint32(responseTo))
	binary.LittleEndian.PutUint32(w.buf[12:], opReply)
	w.buf = append(w.buf, 0, 0, 0, 0) // responseFlags
	w.buf = append(w.buf, 0, 0, 0, 0, 0, 0, 0, 0)
	w.buf = append(w.buf, 0, 0, 0, 0) // startingFrom
	w.buf = append(w.buf, 1, 0, 0, 0) // numberReturned
}

// setMoreToCome marks an OP_MSG reply as one of a stream (exhaust).
func (w *msgWriter) setMoreToCome() {
	w.buf[headerLen] |= flagMoreToCome
}

// finish stamps the length and request id.
func (w *msgWriter) finish(requestID int32) []byte {
	binary.LittleEndian.PutUint32(w.buf[0:], uint32(len(w.buf)))
	binary.LittleEndian.PutUint32(w.buf[4:], uint32(requestID))
	return w.buf
}
