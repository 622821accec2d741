package webhook

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"
	"testing/iotest"

	"github.com/changegate/changegate/sinks"
)

// TestReqBodyBytes: the body a request reads (through its reader, in reads
// of several sizes), hashes (signatures, SigV4) and reports as its length is,
// byte for byte, what sinks.AppendJSONArray makes of the same envelopes
// (the body batch requests carried before reqBody), and a single envelope
// as is.
func TestReqBodyBytes(t *testing.T) {
	envs := [][]byte{[]byte(`{"a":1}`), []byte(`{"b":"x,y"}`), {}, []byte(`{"c":[1,2,3]}`), []byte(`{}`)}
	var cases []reqBody
	var want [][]byte
	for n := 0; n <= len(envs); n++ {
		cases = append(cases, arrayBody(envs[:n]))
		want = append(want, sinks.AppendJSONArray(nil, envs[:n]...))
	}
	cases = append(cases, oneBody(envs[3]), oneBody(nil))
	want = append(want, envs[3], nil)
	for i, b := range cases {
		if got := b.bytes(); !bytes.Equal(got, want[i]) {
			t.Errorf("case %d: bytes %q, want %q", i, got, want[i])
		}
		if b.n != len(want[i]) {
			t.Errorf("case %d: n = %d, want %d", i, b.n, len(want[i]))
		}
		for _, size := range []int{1, 2, 3, 7, 4096} {
			r, _ := b.reader()
			if l := r.(interface{ Len() int }).Len(); l != len(want[i]) {
				t.Errorf("case %d: Len %d, want %d", i, l, len(want[i]))
			}
			got, err := readInChunks(r, size)
			if err != nil || !bytes.Equal(got, want[i]) {
				t.Errorf("case %d, reads of %d: %q, %v; want %q", i, size, got, err, want[i])
			}
		}
		r, _ := b.reader()
		if err := iotest.TestReader(r, want[i]); err != nil {
			t.Errorf("case %d: %v", i, err)
		}
		if got, w := b.sha256Hex(), sha256.Sum256(want[i]); got != hex.EncodeToString(w[:]) {
			t.Errorf("case %d: sha256 %s, want %x", i, got, w)
		}
		s, err := newSigner([]string{testSecret})
		if err != nil {
			t.Fatal(err)
		}
		wantSig := independentSig(t, testSecret, "id", "123", want[i])
		if got := string(s.appendSignatures(nil, "id", "123", &b)); got != wantSig {
			t.Errorf("case %d: signature %s, want %s", i, got, wantSig)
		}
	}
}

func readInChunks(r io.Reader, size int) ([]byte, error) {
	var out []byte
	buf := make([]byte, size)
	for {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if n == 0 {
			return out, io.ErrNoProgress
		}
	}
}
