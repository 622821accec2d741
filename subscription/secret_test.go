package subscription

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/sinks/webhook"
)

func testSealer(t *testing.T, fill byte) *Sealer {
	t.Helper()
	s, err := NewSealer(bytes.Repeat([]byte{fill}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSealRoundTripAndWrongKey(t *testing.T) {
	s := testSealer(t, 1)
	secret, err := GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	sealed, err := s.Seal("team-a-orders", secret, at)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed.Sealed, []byte(secret.Value())) || sealed.KeyID != s.KeyID() || !sealed.CreatedAt.Equal(at) {
		t.Fatalf("sealed = %+v", sealed)
	}
	got, err := s.Open("team-a-orders", sealed)
	if err != nil || got != secret {
		t.Fatalf("Open = %v, %v", got == secret, err)
	}
	// Two seals of one secret differ (random nonce).
	again, _ := s.Seal("team-a-orders", secret, at)
	if bytes.Equal(again.Sealed, sealed.Sealed) {
		t.Error("sealing twice gave the same bytes")
	}

	other := testSealer(t, 2)
	tampered := sealed
	tampered.Sealed = bytes.Clone(sealed.Sealed)
	tampered.Sealed[len(tampered.Sealed)-1] ^= 1
	forged := sealed
	forged.KeyID = other.KeyID() // claims the other key: authentication still fails
	for name, open := range map[string]func() (config.Secret, error){
		"another key":          func() (config.Secret, error) { return other.Open("team-a-orders", sealed) },
		"another subscription": func() (config.Secret, error) { return s.Open("team-b-orders", sealed) },
		"altered bytes":        func() (config.Secret, error) { return s.Open("team-a-orders", tampered) },
		"forged key id":        func() (config.Secret, error) { return other.Open("team-a-orders", forged) },
		"truncated": func() (config.Secret, error) {
			return s.Open("team-a-orders", SealedSecret{KeyID: s.KeyID(), Sealed: sealed.Sealed[:10]})
		},
	} {
		got, err := open()
		if !errors.Is(err, ErrWrongKey) || got != "" {
			t.Errorf("%s: Open = %q, %v; want ErrWrongKey", name, got, err)
		}
		if err != nil && strings.Contains(err.Error(), secret.Value()) {
			t.Errorf("%s: the error shows the secret", name)
		}
	}
	_, err = other.Open("team-a-orders", sealed)
	if want := fmt.Sprintf("(sealed under key id %s, the configured key's id is %s)", s.KeyID(), other.KeyID()); !strings.Contains(err.Error(), want) {
		t.Errorf("wrong key error %q does not say %q", err, want)
	}
	if _, err := NewSealer(make([]byte, 16)); err == nil {
		t.Error("a 16-byte key was accepted")
	}
}

func TestGenerateSecret(t *testing.T) {
	a, _ := GenerateSecret()
	b, _ := GenerateSecret()
	if a == b {
		t.Fatal("two secrets are equal")
	}
	raw, ok := strings.CutPrefix(a.Value(), "whsec_")
	key, err := base64.StdEncoding.DecodeString(raw)
	if !ok || err != nil || len(key) != 32 {
		t.Fatalf("secret %q: want whsec_ + base64 of 32 bytes", a.Value())
	}
	if fmt.Sprint(a) != "[redacted]" || fmt.Sprintf("%v %s %q", a, a, a) != `[redacted] [redacted] "[redacted]"` {
		t.Error("a secret prints")
	}
	// The webhook sink signs with it.
	if _, err := webhook.Sign([]string{a.Value()}, "msg", time.Now(), []byte("{}")); err != nil {
		t.Errorf("the webhook sink refuses a generated secret: %v", err)
	}
}

func TestRotateKeepsOverlapAndBound(t *testing.T) {
	now := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	s := []SealedSecret{{KeyID: "a"}}
	s = rotate(s, SealedSecret{KeyID: "b"}, now, time.Hour)
	if len(s) != 2 || s[0].KeyID != "b" || !s[0].ExpiresAt.IsZero() || !s[1].ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("after one rotation: %+v", s)
	}
	// Without overlap the previous one goes at once; expired ones go too.
	s = rotate(s, SealedSecret{KeyID: "c"}, now.Add(2*time.Hour), 0)
	if len(s) != 1 || s[0].KeyID != "c" {
		t.Fatalf("after a rotation without overlap, an hour past the first overlap: %+v", s)
	}
	for i := range 10 {
		s = rotate(s, SealedSecret{KeyID: fmt.Sprint(i)}, now, time.Hour)
	}
	if len(s) != 1+maxOldSecrets || s[0].KeyID != "9" || s[maxOldSecrets].KeyID != "5" {
		t.Errorf("after 10 rotations: %d secrets, %+v", len(s), s)
	}
}
