package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/changegate/changegate/receive"
)

// Standard Webhooks header names, in canonical MIME form (HTTP header names
// are case-insensitive; the spec writes them in lower case). They are the
// receive package's, which verifies what this sink signs.
const (
	HeaderID        = receive.HeaderID
	HeaderTimestamp = receive.HeaderTimestamp
	HeaderSignature = receive.HeaderSignature
)

// MinSecretBytes is the shortest signing key accepted: Standard Webhooks
// secrets are 24 to 64 random bytes, and a shorter key can be guessed
// from signed messages.
const MinSecretBytes = 24

// Errors returned by Verify, for errors.Is. All but ErrNoSecrets are the
// receive package's errors under this package's names.
var (
	// ErrMissingHeaders means a Standard Webhooks header is absent.
	ErrMissingHeaders = receive.ErrMissingHeaders
	// ErrInvalidTimestamp means webhook-timestamp is not unix seconds.
	ErrInvalidTimestamp = receive.ErrInvalidTimestamp
	// ErrTimestampOutOfTolerance means the message is too old or too new.
	ErrTimestampOutOfTolerance = receive.ErrStale
	// ErrNoMatchingSignature means no v1 signature matches any secret.
	ErrNoMatchingSignature = receive.ErrSignature
	// ErrNoSecrets means Verify was given no secret to check against.
	ErrNoSecrets = errors.New("no webhook secrets to verify with")
)

// DecodeSecret returns the HMAC key of a Standard Webhooks secret:
// "whsec_<base64>" is base64-decoded (standard alphabet, padded or not);
// any other string is used as raw bytes. It is receive.DecodeSecret; the
// error does not echo the secret.
func DecodeSecret(secret string) ([]byte, error) {
	return receive.DecodeSecret(secret)
}

// signer computes Standard Webhooks v1 signatures with a fixed set of keys.
// It is safe for concurrent use; HMAC states are pooled so that signing does
// not allocate.
type signer struct {
	keys [][]byte
	pool sync.Pool // of *macSet
}

// macSet is one HMAC-SHA256 state per key plus scratch space.
type macSet struct {
	macs   []hash.Hash
	prefix []byte
	sum    [sha256.Size]byte
}

func newSigner(secrets []string) (*signer, error) {
	if len(secrets) == 0 {
		return nil, nil
	}
	s := &signer{keys: make([][]byte, len(secrets))}
	for i, sec := range secrets {
		k, err := DecodeSecret(sec)
		if err != nil {
			return nil, fmt.Errorf("secrets[%d]: %w", i, err)
		}
		if len(k) < MinSecretBytes {
			return nil, fmt.Errorf("secrets[%d]: the key is %d bytes, want at least %d random bytes (e.g. \"whsec_\" + the output of openssl rand -base64 32)", i, len(k), MinSecretBytes)
		}
		s.keys[i] = k
	}
	s.pool.New = func() any {
		m := &macSet{macs: make([]hash.Hash, len(s.keys)), prefix: make([]byte, 0, 128)}
		for i, k := range s.keys {
			m.macs[i] = hmac.New(sha256.New, k)
		}
		return m
	}
	return s, nil
}

// appendSignatures appends the webhook-signature header value for the
// message id, timestamp ts (decimal unix seconds) and body to dst: one
// "v1,<base64>" per key, separated by spaces. The body is hashed in place,
// piece by piece.
func (s *signer) appendSignatures(dst []byte, id, ts string, body *reqBody) []byte {
	m := s.pool.Get().(*macSet)
	m.prefix = append(m.prefix[:0], id...)
	m.prefix = append(m.prefix, '.')
	m.prefix = append(m.prefix, ts...)
	m.prefix = append(m.prefix, '.')
	for i, h := range m.macs {
		if i > 0 {
			dst = append(dst, ' ')
		}
		h.Reset()
		h.Write(m.prefix)
		body.writeTo(h)
		dst = append(dst, "v1,"...)
		dst = base64.StdEncoding.AppendEncode(dst, h.Sum(m.sum[:0]))
	}
	if cap(m.prefix) <= 4096 { // do not keep a huge id's buffer alive
		s.pool.Put(m)
	}
	return dst
}

// Sign returns the webhook-signature header value for a message: one
// "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>" per secret, separated by
// spaces. Secrets are decoded as by DecodeSecret. It is meant for tests and
// tools; the sink keeps its decoded keys and does not call it.
func Sign(secrets []string, id string, timestamp time.Time, body []byte) (string, error) {
	s, err := newSigner(secrets)
	if err != nil {
		return "", err
	}
	if s == nil {
		return "", ErrNoSecrets
	}
	return string(s.appendSignatures(nil, id, strconv.FormatInt(timestamp.Unix(), 10), ptr(oneBody(body)))), nil
}

func ptr[T any](v T) *T {
	return &v
}

// Verify checks a Standard Webhooks message as a receiver would: the
// webhook-id, webhook-timestamp and webhook-signature headers must be
// present, the timestamp must be within tolerance of now (tolerance <= 0
// disables that check; receivers should use a few minutes to limit replays),
// and at least one v1 signature in the header must match the HMAC of
// "id.timestamp.body" under at least one of secrets (each "whsec_<base64>"
// or raw). Comparisons are constant-time. The error wraps one of the Err…
// values of this package, or describes a malformed secret (checked first).
// It is receive.Verifier's check, with the secrets, tolerance and clock
// given per call.
func Verify(secrets []string, headers http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	if len(secrets) == 0 {
		return ErrNoSecrets
	}
	v, err := receive.NewVerifier(secrets...)
	if err != nil {
		return err
	}
	v.Tolerance = tolerance
	v.Now = func() time.Time { return now }
	_, err = v.Verify(headers, body)
	return err
}
