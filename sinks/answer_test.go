package sinks

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// An answer's excerpt is printable, trimmed and at most MaxAnswer bytes,
// cut on a rune boundary.
func TestAnswer(t *testing.T) {
	long := strings.Repeat("é", MaxAnswer) // 2 bytes each
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"  ok\n", "ok"},
		{"bad\x1b[31m\x00request", "bad [31m request"},
		{"x" + long, "x" + long[:MaxAnswer-4] + "..."},
	} {
		got := Answer([]byte(tc.in))
		if got != tc.want {
			t.Errorf("Answer(%.40q...) = %.40q... (%d bytes), want %.40q... (%d bytes)", tc.in, got, len(got), tc.want, len(tc.want))
		}
		if len(got) > MaxAnswer || !utf8.ValidString(got) {
			t.Errorf("Answer(%.40q...): %d bytes, valid %v", tc.in, len(got), utf8.ValidString(got))
		}
	}
}
