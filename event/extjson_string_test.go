package event

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestValidJSONStringMatchesReference checks the eight-bytes-at-a-time
// escaper, strict and lossy (U+FFFD for a byte of invalid UTF-8), against
// the byte-by-byte reference (and utf8.Valid) on random strings
// made of the bytes that matter: every escape, the bytes next to the
// has-less/has-zero boundaries, multi-byte runes, U+2028/9, and invalid
// sequences, at every offset in and across 8-byte words.
func TestValidJSONStringMatchesReference(t *testing.T) {
	pieces := []string{"a", "z", " ", "!", "#", "[", "]", "~", "\x7f", "\"", "\\", "\n", "\r", "\t", "\b", "\f",
		"\x00", "\x01", "\x1f", "\x21", "\x5b", "\x5d", "\x22\x22", "é", "世", "😀", "\u2028", "\u2029",
		"\xff", "\xc3", "\xe4\xb8", "\x80", "abcdefgh", "01234567890123456"}
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 20000; n++ {
		var sb strings.Builder
		for k := r.IntN(12); k > 0; k-- {
			sb.WriteString(pieces[r.IntN(len(pieces))])
		}
		s := []byte(sb.String())
		want := refAppendJSONString([]byte("x"), string(s))
		if lossy := appendJSONString([]byte("x"), string(s)); !bytes.Equal(lossy, want) {
			t.Fatalf("%q: appendJSONString %s, want %s", s, lossy, want)
		}
		got, ok := appendValidJSONString([]byte("x"), s)
		if ok != utf8.Valid(s) {
			t.Fatalf("%q: valid %v, want %v", s, ok, utf8.Valid(s))
		}
		if !ok {
			if of, okOf := appendValidJSONStringOf([]byte("x"), string(s)); okOf || string(of) != "x" {
				t.Fatalf("%q: appendValidJSONStringOf %s, %v, want x, false", s, of, okOf)
			}
			continue
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
		if of, _ := appendValidJSONStringOf([]byte("x"), string(s)); !bytes.Equal(of, want) {
			t.Fatalf("%q: appendValidJSONStringOf %s, want %s", s, of, want)
		}
	}
}

// TestLargeStringEnvelopeMatchesDriver checks the envelope of a change
// with a 1 MiB string of mixed content against the driver's encoding.
func TestLargeStringEnvelopeMatchesDriver(t *testing.T) {
	var sb strings.Builder
	for sb.Len() < 1<<20 {
		sb.WriteString("plain text run, then \"quotes\" and \\ and \n\t and héllo 世界 \u2028 ")
	}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "82AA"}}},
		{Key: "operationType", Value: "insert"},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: int32(1)}, {Key: "big", Value: sb.String()}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int32(1)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, canonical := range []bool{false, true} {
		e, err := FromChange("s", 1, raw)
		if err != nil {
			t.Fatal(err)
		}
		fast, err := e.encodeFast(canonical)
		if err != nil {
			t.Fatal(err)
		}
		slow, err := e.encodeDriver(canonical)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fast, slow) {
			t.Fatalf("canonical %v: fast and driver encodings differ (%d and %d bytes)", canonical, len(fast), len(slow))
		}
	}
}
