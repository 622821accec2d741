package subscription

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/changegate/changegate/config"
)

// Secret rotation bounds.
const (
	// DefaultOverlap is how long a rotated-out secret keeps signing.
	DefaultOverlap = 24 * time.Hour
	// MaxOverlap bounds the overlap a rotation may ask for.
	MaxOverlap = 7 * 24 * time.Hour
	// maxOldSecrets bounds the rotated-out secrets kept while they
	// overlap (the oldest are dropped first).
	maxOldSecrets = 4
	// secretBytes is the length of a generated signing key.
	secretBytes = 32
)

var (
	// ErrNoKey is returned when a secret must be sealed or opened and no
	// key is configured.
	ErrNoKey = fmt.Errorf("no key to encrypt subscription secrets: set %s or [subscriptions] key_file to 32 random bytes, base64 (openssl rand -base64 32)", config.SubscriptionKeyEnv)
	// ErrWrongKey is returned (wrapped) when a sealed secret cannot be
	// opened with the configured key: another key sealed it, or it was
	// altered.
	ErrWrongKey = errors.New("the subscription secret cannot be decrypted with the configured key")
)

// SealedSecret is a signing secret as stored: encrypted with AES-256-GCM
// under the operator's key, bound to its subscription's name.
type SealedSecret struct {
	// KeyID identifies the key that sealed it (not the key itself).
	KeyID string `bson:"kid"`
	// Sealed is the 12-byte nonce followed by the ciphertext and tag.
	Sealed []byte `bson:"sealed"`
	// CreatedAt is when the secret was generated.
	CreatedAt time.Time `bson:"created_at"`
	// ExpiresAt is when a rotated-out secret stops signing; zero for the
	// current secret.
	ExpiresAt time.Time `bson:"expires_at,omitempty"`
}

// Sealer encrypts and decrypts signing secrets with one 32-byte key. It is
// safe for concurrent use.
type Sealer struct {
	aead cipher.AEAD
	id   string
}

// NewSealer returns a Sealer for key, which must be 32 bytes.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != config.SubscriptionKeyBytes {
		return nil, fmt.Errorf("subscription key: %d bytes, want %d", len(key), config.SubscriptionKeyBytes)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("subscription key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("subscription key: %w", err)
	}
	sum := sha256.Sum256(append([]byte("changegate subscription key id\x00"), key...))
	return &Sealer{aead: aead, id: hex.EncodeToString(sum[:8])}, nil
}

// KeyID identifies the key (a hash of it), for messages and stored
// secrets.
func (s *Sealer) KeyID() string { return s.id }

// aad binds a sealed secret to its subscription: a sealed secret copied to
// another subscription does not open.
func aad(name string) []byte { return []byte("changegate subscription secret\x00" + name) }

// Seal encrypts secret for the subscription name.
func (s *Sealer) Seal(name string, secret config.Secret, created time.Time) (SealedSecret, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(secret.Value())+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return SealedSecret{}, fmt.Errorf("seal secret: %w", err)
	}
	return SealedSecret{
		KeyID:     s.id,
		Sealed:    s.aead.Seal(nonce, nonce, []byte(secret.Value()), aad(name)),
		CreatedAt: created.UTC(),
	}, nil
}

// Open decrypts a secret sealed for the subscription name. The error wraps
// ErrWrongKey when the key differs or the sealed bytes were altered; it
// never contains the secret.
func (s *Sealer) Open(name string, ss SealedSecret) (config.Secret, error) {
	if ss.KeyID != s.id {
		return "", fmt.Errorf("subscription %s: %w (sealed under key id %s, the configured key's id is %s)", name, ErrWrongKey, ss.KeyID, s.id)
	}
	n := s.aead.NonceSize()
	if len(ss.Sealed) < n+s.aead.Overhead() {
		return "", fmt.Errorf("subscription %s: %w (sealed secret too short)", name, ErrWrongKey)
	}
	plain, err := s.aead.Open(nil, ss.Sealed[:n], ss.Sealed[n:], aad(name))
	if err != nil {
		return "", fmt.Errorf("subscription %s: %w (authentication failed)", name, ErrWrongKey)
	}
	return config.Secret(plain), nil
}

// GenerateSecret returns a new Standard Webhooks signing secret: "whsec_"
// followed by 32 random bytes in standard base64.
func GenerateSecret() (config.Secret, error) {
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate secret: %w", err)
	}
	return config.Secret("whsec_" + base64.StdEncoding.EncodeToString(b[:])), nil
}

// rotate returns secrets with next as the current secret: the previous
// current one signs until now+overlap (not at all with overlap 0), those
// already expired are dropped, and at most maxOldSecrets old ones are kept.
func rotate(secrets []SealedSecret, next SealedSecret, now time.Time, overlap time.Duration) []SealedSecret {
	out := []SealedSecret{next}
	for _, s := range secrets {
		if s.ExpiresAt.IsZero() {
			if overlap <= 0 {
				continue
			}
			s.ExpiresAt = now.Add(overlap).UTC()
		}
		if !s.ExpiresAt.After(now) || len(out) > maxOldSecrets {
			continue
		}
		out = append(out, s)
	}
	return out
}

// SigningSecrets returns the secrets the subscription's requests are signed
// with at now: the current one first, then the rotated-out ones whose
// overlap has not ended. The webhook sink signs with every one (Standard
// Webhooks allows several space-separated signatures), so receivers that
// know either secret verify during the overlap.
func (s *Subscription) SigningSecrets(now time.Time, sealer *Sealer) ([]config.Secret, error) {
	if sealer == nil {
		return nil, ErrNoKey
	}
	var out []config.Secret
	for _, ss := range s.Secrets {
		if !ss.ExpiresAt.IsZero() && !ss.ExpiresAt.After(now) {
			continue
		}
		sec, err := sealer.Open(s.Name, ss)
		if err != nil {
			return nil, err
		}
		out = append(out, sec)
	}
	return out, nil
}

// nextExpiry returns when the next rotated-out secret stops signing after
// now, or the zero time.
func (s *Subscription) nextExpiry(now time.Time) time.Time {
	var next time.Time
	for _, ss := range s.Secrets {
		if ss.ExpiresAt.After(now) && (next.IsZero() || ss.ExpiresAt.Before(next)) {
			next = ss.ExpiresAt
		}
	}
	return next
}
