package webhook

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"strings"
)

// reqBody is the body of one request: a single envelope, or a JSON array of
// envelopes ('[', the envelopes separated by ',', ']': the bytes
// sinks.AppendJSONArray makes).
//
// Where the bytes live: a single envelope is the one cached on its event
// (event.Event.Envelope, charged to the event's share of the byte budget),
// or a stripped one Send made (charged while Send runs); it is not copied.
// An array is the one copy of a batch request, joined once by arrayBody
// (charged by its caller while it is sent). The signatures and the SigV4
// payload hash read the envelopes in place (writeTo); go-retryablehttp
// makes a new reader of the same bytes for each try and for the HTTP
// client's rewinds (reader), never a copy. The readers are *bytes.Reader or
// *strings.Reader: net/http then writes the headers and a small body with
// one write (a reader of another type makes it flush the headers apart).
type reqBody struct {
	one    []byte   // the envelope (not array)
	parts  [][]byte // the envelopes (array)
	array  bool
	n      int    // length in bytes
	joined string // the array, joined (array only)
}

// oneBody is the body of a request of one envelope.
func oneBody(env []byte) reqBody {
	return reqBody{one: env, n: len(env)}
}

// arrayBody is the body of a request of the envelopes parts as one JSON
// array; parts is not copied, the array is joined once. The joined array
// is not zeroed first (strings.Builder.Grow), which saves clearing
// max_request_bytes of memory per request.
func arrayBody(parts [][]byte) reqBody {
	n := 2 + max(len(parts)-1, 0)
	for _, p := range parts {
		n += len(p)
	}
	var sb strings.Builder
	sb.Grow(n)
	sb.WriteByte('[')
	for i, p := range parts {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.Write(p)
	}
	sb.WriteByte(']')
	return reqBody{parts: parts, array: true, n: n, joined: sb.String()}
}

var (
	openBracket  = []byte{'['}
	comma        = []byte{','}
	closeBracket = []byte{']'}
)

// pieces returns how many pieces the body is read in.
func (b *reqBody) pieces() int {
	switch {
	case !b.array:
		return 1
	case len(b.parts) == 0:
		return 2 // []
	}
	return 2*len(b.parts) + 1
}

// piece returns the k-th piece of the body: for an array, '[' first, ']'
// last, the envelopes at odd k and ',' between them.
func (b *reqBody) piece(k int) []byte {
	if !b.array {
		return b.one
	}
	switch {
	case k == 0:
		return openBracket
	case k == b.pieces()-1:
		return closeBracket
	case k%2 == 1:
		return b.parts[k/2]
	default:
		return comma
	}
}

// writeTo writes the body to h (a hash: no error).
func (b *reqBody) writeTo(h hash.Hash) {
	for k, n := 0, b.pieces(); k < n; k++ {
		h.Write(b.piece(k))
	}
}

// bytes returns the body as one slice, joined from its pieces (tests).
func (b *reqBody) bytes() []byte {
	out := make([]byte, 0, b.n)
	for k, n := 0, b.pieces(); k < n; k++ {
		out = append(out, b.piece(k)...)
	}
	return out
}

// sha256Hex returns the hex SHA-256 of the body (SigV4's payload hash).
func (b *reqBody) sha256Hex() string {
	h := sha256.New()
	b.writeTo(h)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// reader returns a new reader of the whole body (go-retryablehttp's
// ReaderFunc).
func (b *reqBody) reader() (io.Reader, error) {
	if b.array {
		return strings.NewReader(b.joined), nil
	}
	return bytes.NewReader(b.one), nil
}
