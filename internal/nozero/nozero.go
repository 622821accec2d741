// Package nozero allocates byte buffers that are about to be overwritten
// without clearing them first. make([]byte, 0, n) clears all n bytes; for a
// buffer of megabytes that an encoder then fills, the clearing is a pass
// over memory as long as the encoding's own copy (issue 43: 0.1 ms per MiB
// of a large change's envelope).
package nozero

import (
	"strings"
	"unsafe"
)

// Bytes returns an empty slice with a capacity of at least n whose memory
// is not cleared. The bytes between its length and its capacity are
// whatever the allocator left there: a caller must only read what it has
// written, and never reslice past its length (the encoders that use it
// append, and hand on b[:len(b)]).
//
// strings.Builder.Grow is the standard library's way to such memory (it
// allocates with the runtime's non-zeroing make); the builder's buffer is
// then taken over, and the builder and its (empty) string dropped, so no
// string ever sees the bytes change.
func Bytes(n int) []byte {
	if n <= 0 {
		return nil
	}
	var sb strings.Builder
	sb.Grow(n)
	sb.WriteByte(0) // a non-empty string: its data pointer is the buffer
	s := sb.String()
	return unsafe.Slice(unsafe.StringData(s), sb.Cap())[:0]
}
