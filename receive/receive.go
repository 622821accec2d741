// Package receive is the receiving side of changegate, for Go services and
// Lambdas: it verifies a Standard Webhooks request as changegate signs it and
// decodes the event envelope, and it decodes the same envelope out of an
// EventBridge event or an SQS message as a Lambda receives them.
//
// It uses the standard library only, so importing it adds nothing to a
// receiver's dependencies beyond this package.
//
// A webhook handler:
//
//	v, err := receive.NewVerifier(os.Getenv("WEBHOOK_SECRET"))
//	...
//	http.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
//		msg, err := v.Request(r, 1<<20)
//		if err != nil {
//			http.Error(w, err.Error(), receive.StatusFor(err))
//			return
//		}
//		// msg.ID is the webhook-id: the stable event id, the same on a
//		// re-delivery. Deduplicate on it.
//		envs, err := receive.DecodeBatch(msg.Body)
//		...
//	})
//
// The envelope's document fields (documentKey, fullDocument, ...) are
// MongoDB Extended JSON; they are kept as json.RawMessage so the receiver
// decodes them into its own types (relaxed Extended JSON reads into plain Go
// types for strings, numbers, booleans, arrays and documents).
package receive

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks header names (https://www.standardwebhooks.com/), as
// changegate sends them. net/http matches header names case-insensitively.
const (
	HeaderID        = "Webhook-Id"
	HeaderTimestamp = "Webhook-Timestamp"
	HeaderSignature = "Webhook-Signature"
)

// DefaultTolerance is how far webhook-timestamp may be from the receiver's
// clock, the value the Standard Webhooks reference libraries use.
const DefaultTolerance = 5 * time.Minute

// Errors of Verify and Request, for errors.Is.
var (
	// ErrMissingHeaders: webhook-id, webhook-timestamp or webhook-signature
	// is absent.
	ErrMissingHeaders = errors.New("missing webhook-id, webhook-timestamp or webhook-signature header")
	// ErrInvalidTimestamp: webhook-timestamp is not decimal unix seconds.
	ErrInvalidTimestamp = errors.New("invalid webhook-timestamp")
	// ErrStale: webhook-timestamp is further than the tolerance from now
	// (a replayed or badly delayed request, or a skewed clock).
	ErrStale = errors.New("webhook-timestamp outside the tolerance")
	// ErrSignature: no v1 signature in the header matches any secret (wrong
	// secret, or the body, id or timestamp was altered).
	ErrSignature = errors.New("no matching webhook signature")
	// ErrTooLarge: the request body exceeds the limit given to Request.
	ErrTooLarge = errors.New("request body too large")
)

// StatusFor returns the HTTP status a receiver should answer for an error of
// Request: 413 for ErrTooLarge, 400 for a malformed request, 401 for a
// signature or timestamp that does not verify, 500 otherwise. changegate
// dead-letters an event answered with a 4xx other than 408 and 429, and
// retries 5xx.
func StatusFor(err error) int {
	switch {
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrMissingHeaders), errors.Is(err, ErrInvalidTimestamp):
		return http.StatusBadRequest
	case errors.Is(err, ErrSignature), errors.Is(err, ErrStale):
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// DecodeSecret returns the HMAC key of a Standard Webhooks secret as
// changegate reads it: "whsec_<base64>" is base64-decoded (standard
// alphabet, padded or not); any other string is used as raw bytes.
func DecodeSecret(secret string) ([]byte, error) {
	if secret == "" {
		return nil, errors.New("empty secret")
	}
	b64, ok := strings.CutPrefix(secret, "whsec_")
	if !ok {
		return []byte(secret), nil
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		key, err = base64.RawStdEncoding.DecodeString(b64)
	}
	if err != nil {
		return nil, errors.New(`secret starts with "whsec_" but the rest is not valid base64`)
	}
	if len(key) == 0 {
		return nil, errors.New(`secret "whsec_" has no key after the prefix`)
	}
	return key, nil
}

// Verifier checks Standard Webhooks signatures against one or more secrets
// (several during a rotation: a request verifies when any v1 signature it
// carries matches any secret). It is safe for concurrent use once built; do
// not change its fields while it is in use.
type Verifier struct {
	keys [][]byte
	// Tolerance is how far webhook-timestamp may be from Now, in either
	// direction; NewVerifier sets DefaultTolerance. Zero or less disables
	// the check (not recommended: it is the replay protection).
	Tolerance time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// NewVerifier returns a Verifier for secrets, each "whsec_<base64>" or raw
// bytes, as configured on the changegate sink (secret or secrets).
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("no webhook secrets to verify with")
	}
	v := &Verifier{Tolerance: DefaultTolerance}
	for i, s := range secrets {
		k, err := DecodeSecret(s)
		if err != nil {
			return nil, fmt.Errorf("secrets[%d]: %w", i, err)
		}
		v.keys = append(v.keys, k)
	}
	return v, nil
}

// Verify checks the Standard Webhooks headers of a request whose body is
// body: the three headers are present, webhook-timestamp is within the
// tolerance, and one v1 signature matches HMAC-SHA256(key,
// "<webhook-id>.<webhook-timestamp>.<body>") for one of the keys
// (constant-time comparison). It returns the webhook-id, changegate's stable
// event id. The error wraps one of the Err… values.
func (v *Verifier) Verify(h http.Header, body []byte) (id string, err error) {
	id = h.Get(HeaderID)
	tsStr := h.Get(HeaderTimestamp)
	sigs := h.Values(HeaderSignature)
	if id == "" || tsStr == "" || len(sigs) == 0 {
		return "", ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(tsStr, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: %q", ErrInvalidTimestamp, tsStr)
	}
	if v.Tolerance > 0 {
		now := time.Now
		if v.Now != nil {
			now = v.Now
		}
		d := now().Sub(time.Unix(ts, 0))
		if d > v.Tolerance || d < -v.Tolerance {
			return "", fmt.Errorf("%w: %s is %s from now, tolerance %s", ErrStale, tsStr, d.Round(time.Second), v.Tolerance)
		}
	}
	var candidates [][]byte
	for _, hv := range sigs {
		for _, part := range strings.Fields(hv) {
			b64, ok := strings.CutPrefix(part, "v1,")
			if !ok {
				continue // other schemes (v1a, ...) are not HMAC
			}
			if sig, err := base64.StdEncoding.DecodeString(b64); err == nil && len(sig) == sha256.Size {
				candidates = append(candidates, sig)
			}
		}
	}
	if len(candidates) == 0 {
		return "", fmt.Errorf("%w: no v1 signature in the header", ErrSignature)
	}
	var sum [sha256.Size]byte
	for _, k := range v.keys {
		mac := hmac.New(sha256.New, k)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(tsStr))
		mac.Write([]byte{'.'})
		mac.Write(body)
		want := mac.Sum(sum[:0])
		for _, c := range candidates {
			if hmac.Equal(want, c) {
				return id, nil
			}
		}
	}
	return "", ErrSignature
}

// Message is a verified webhook request.
type Message struct {
	// ID is the webhook-id header: changegate's event id for one event;
	// for a batch, "batch_" + a hash of its events' ids (each envelope has
	// its own "id"). A re-delivery carries the same id.
	ID string
	// Timestamp is webhook-timestamp, the time of this attempt.
	Timestamp time.Time
	// Body is the request body: one envelope, or a JSON array of them when
	// the sink has batch_size > 1 (DecodeBatch reads both).
	Body []byte
}

// Request reads r's body (at most maxBytes; <= 0 means 1 MiB, changegate's
// default max_request_bytes) and verifies it. It does not close the body;
// net/http does that for a server's requests.
func (v *Verifier) Request(r *http.Request, maxBytes int64) (*Message, error) {
	if maxBytes <= 0 {
		maxBytes = 1 << 20
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("%w: over %d bytes", ErrTooLarge, maxBytes)
	}
	id, err := v.Verify(r.Header, body)
	if err != nil {
		return nil, err
	}
	ts, _ := strconv.ParseInt(r.Header.Get(HeaderTimestamp), 10, 64) // checked by Verify
	return &Message{ID: id, Timestamp: time.Unix(ts, 0), Body: body}, nil
}
