package sinks

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func constRnd(v float64) func() float64 { return func() float64 { return v } }

func TestDefaultRetryPolicy(t *testing.T) {
	got := DefaultRetryPolicy()
	want := RetryPolicy{
		MaxAttempts: 8, InitialInterval: 500 * time.Millisecond, MaxInterval: time.Minute,
		MaxElapsed: 15 * time.Minute, Multiplier: 2, Jitter: 0.2,
	}
	if got != want {
		t.Fatalf("DefaultRetryPolicy() = %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestRetryPolicyNext(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	noJitter := RetryPolicy{MaxAttempts: 8, InitialInterval: 500 * time.Millisecond, MaxInterval: time.Minute, Multiplier: 2}
	withJitter := noJitter
	withJitter.Jitter = 0.2
	retryable := Retryable("http_503", 0, errors.New("503"))
	after := func(d time.Duration) *Error { return Retryable("http_429", d, errors.New("429")) }

	tests := []struct {
		name    string
		p       RetryPolicy
		attempt int
		elapsed time.Duration // now - firstAttempt
		err     *Error
		rnd     float64
		want    time.Duration
		wantOK  bool
	}{
		{"first retry", noJitter, 1, 0, retryable, 0.5, 500 * time.Millisecond, true},
		{"second retry doubles", noJitter, 2, 0, retryable, 0.5, time.Second, true},
		{"third retry", noJitter, 3, 0, retryable, 0.5, 2 * time.Second, true},
		{"seventh retry", noJitter, 7, 0, retryable, 0.5, 32 * time.Second, true},
		{"capped at max interval", RetryPolicy{MaxAttempts: 20, InitialInterval: time.Second, MaxInterval: 5 * time.Second, Multiplier: 2}, 10, 0, retryable, 0.5, 5 * time.Second, true},
		{"huge attempt does not overflow", RetryPolicy{MaxAttempts: math.MaxInt, InitialInterval: time.Second, MaxInterval: time.Hour, Multiplier: 10}, 5000, 0, retryable, 0.5, time.Hour, true},
		{"multiplier 1 is constant", RetryPolicy{MaxAttempts: 5, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 1}, 4, 0, retryable, 0.5, time.Second, true},
		{"multiplier 1.5", RetryPolicy{MaxAttempts: 5, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 1.5}, 3, 0, retryable, 0.5, 2250 * time.Millisecond, true},

		{"jitter midpoint", withJitter, 1, 0, retryable, 0.5, 500 * time.Millisecond, true},
		{"jitter low end", withJitter, 1, 0, retryable, 0, 400 * time.Millisecond, true},
		{"jitter high end", withJitter, 1, 0, retryable, 1, 600 * time.Millisecond, true},
		{"jitter quarter", withJitter, 2, 0, retryable, 0.25, 900 * time.Millisecond, true},
		{"jitter capped at max interval", RetryPolicy{MaxAttempts: 8, InitialInterval: 10 * time.Second, MaxInterval: 10 * time.Second, Multiplier: 2, Jitter: 0.5}, 1, 0, retryable, 1, 10 * time.Second, true},
		{"jitter below max interval stays random", RetryPolicy{MaxAttempts: 8, InitialInterval: 10 * time.Second, MaxInterval: 10 * time.Second, Multiplier: 2, Jitter: 0.5}, 1, 0, retryable, 0, 5 * time.Second, true},
		{"full jitter can reach zero", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 2, Jitter: 1}, 1, 0, retryable, 0, 0, true},
		{"rnd out of range is clamped", withJitter, 1, 0, retryable, 7, 600 * time.Millisecond, true},
		{"rnd NaN is clamped", withJitter, 1, 0, retryable, math.NaN(), 400 * time.Millisecond, true},

		{"permanent error", noJitter, 1, 0, Permanent("http_400", errors.New("400")), 0.5, 0, false},
		{"permanent with retry-after", noJitter, 1, 0, &Error{Err: errors.New("x"), Permanent: true, RetryAfter: time.Second}, 0.5, 0, false},
		{"nil error is retryable", noJitter, 1, 0, nil, 0.5, 500 * time.Millisecond, true},
		{"attempts exhausted", noJitter, 8, 0, retryable, 0.5, 0, false},
		{"attempts beyond max", noJitter, 9, 0, retryable, 0.5, 0, false},
		{"last allowed retry", noJitter, 7, 0, retryable, 0.5, 32 * time.Second, true},
		{"max attempts 1 never retries", RetryPolicy{MaxAttempts: 1}, 1, 0, retryable, 0.5, 0, false},
		{"attempt 0 treated as 1", noJitter, 0, 0, retryable, 0.5, 500 * time.Millisecond, true},

		{"retry-after larger than backoff wins", noJitter, 1, 0, after(3 * time.Second), 0.5, 3 * time.Second, true},
		{"retry-after smaller than backoff ignored", noJitter, 4, 0, after(time.Second), 0.5, 4 * time.Second, true},
		{"retry-after not jittered", withJitter, 1, 0, after(3 * time.Second), 0, 3 * time.Second, true},
		{"retry-after capped at max interval", noJitter, 1, 0, after(time.Hour), 0.5, time.Minute, true},
		{"retry-after does not bypass max attempts", noJitter, 8, 0, after(time.Second), 0.5, 0, false},

		{"within max elapsed", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 2, MaxElapsed: 10 * time.Second}, 1, 8 * time.Second, retryable, 0.5, time.Second, true},
		{"wait ends exactly at max elapsed", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 2, MaxElapsed: 10 * time.Second}, 1, 9 * time.Second, retryable, 0.5, time.Second, true},
		{"wait would pass max elapsed", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 2, MaxElapsed: 10 * time.Second}, 1, 9*time.Second + time.Millisecond, retryable, 0.5, 0, false},
		{"already past max elapsed", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 2, MaxElapsed: 10 * time.Second}, 1, time.Minute, retryable, 0.5, 0, false},
		{"retry-after pushes past max elapsed", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 2, MaxElapsed: 10 * time.Second}, 1, 5 * time.Second, after(30 * time.Second), 0.5, 0, false},
		{"max elapsed 0 is unlimited", noJitter, 3, 1000 * time.Hour, retryable, 0.5, 2 * time.Second, true},

		{"zero policy uses defaults", RetryPolicy{}, 1, 0, retryable, 0, 500 * time.Millisecond, true},
		{"zero policy 8 attempts", RetryPolicy{}, 8, 0, retryable, 0, 0, false},
		{"zero policy max interval 1m", RetryPolicy{}, 7, 0, retryable, 0, 32 * time.Second, true},
		{"negative max attempts means one", RetryPolicy{MaxAttempts: -3}, 1, 0, retryable, 0, 0, false},
		{"max interval below initial raised", RetryPolicy{MaxAttempts: 8, InitialInterval: 2 * time.Second, MaxInterval: time.Second}, 3, 0, retryable, 0, 2 * time.Second, true},
		{"multiplier below 1 clamped", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, Multiplier: 0.5}, 3, 0, retryable, 0, time.Second, true},
		{"jitter above 1 clamped", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, Multiplier: 2, Jitter: 3}, 1, 0, retryable, 1, 2 * time.Second, true},
		{"negative jitter ignored", RetryPolicy{MaxAttempts: 8, InitialInterval: time.Second, Multiplier: 2, Jitter: -1}, 1, 0, retryable, 1, time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.p.Next(tt.attempt, t0, t0.Add(tt.elapsed), tt.err, constRnd(tt.rnd))
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("Next(%d) = %v, %v; want %v, %v", tt.attempt, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestRetryPolicyDefaultSchedule pins the whole default schedule: the
// waits, and that a delivery failing forever is dead-lettered after the
// eighth attempt.
func TestRetryPolicyDefaultSchedule(t *testing.T) {
	p := DefaultRetryPolicy()
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	want := []time.Duration{
		500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 32 * time.Second,
	}
	var got []time.Duration
	for attempt := 1; ; attempt++ {
		wait, ok := p.Next(attempt, t0, now, Retryable("transport", 0, errors.New("x")), constRnd(0.5))
		if !ok {
			if attempt != 8 {
				t.Fatalf("gave up after attempt %d, want 8", attempt)
			}
			break
		}
		got = append(got, wait)
		now = now.Add(wait)
	}
	if len(got) != len(want) {
		t.Fatalf("waits = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits = %v, want %v", got, want)
		}
	}
}

// TestRetryPolicyJitterBounds checks with the real random source that every
// wait stays within ±jitter of the nominal wait and never exceeds
// MaxInterval.
func TestRetryPolicyJitterBounds(t *testing.T) {
	p := DefaultRetryPolicy()
	p.MaxElapsed = 0
	t0 := time.Now()
	for attempt := 1; attempt < p.MaxAttempts; attempt++ {
		nominal := float64(p.InitialInterval) * math.Pow(2, float64(attempt-1))
		lo := time.Duration(nominal * 0.8)
		hi := min(time.Duration(nominal*1.2), p.MaxInterval)
		for range 200 {
			w, ok := p.Next(attempt, t0, t0, nil, nil)
			if !ok || w < lo || w > hi {
				t.Fatalf("attempt %d: Next = %v, %v; want within [%v, %v]", attempt, w, ok, lo, hi)
			}
		}
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	tests := []struct {
		name string
		p    RetryPolicy
		want []string // substrings, all must appear; none means valid
	}{
		{"zero is valid", RetryPolicy{}, nil},
		{"default is valid", DefaultRetryPolicy(), nil},
		{"full jitter valid", RetryPolicy{Jitter: 1, Multiplier: 1}, nil},
		{"negative attempts", RetryPolicy{MaxAttempts: -1}, []string{"max_attempts must be >= 1, got -1"}},
		{"negative durations", RetryPolicy{InitialInterval: -1, MaxInterval: -time.Second, MaxElapsed: -time.Minute}, []string{
			"initial_interval must not be negative, got -1ns",
			"max_interval must not be negative, got -1s",
			"max_elapsed must not be negative, got -1m0s",
		}},
		{"multiplier", RetryPolicy{Multiplier: 0.5}, []string{"multiplier must be >= 1, got 0.5"}},
		{"multiplier NaN", RetryPolicy{Multiplier: math.NaN()}, []string{"multiplier must be >= 1"}},
		{"jitter", RetryPolicy{Jitter: 1.5}, []string{"jitter must be between 0 and 1, got 1.5"}},
		{"max below initial", RetryPolicy{InitialInterval: time.Minute, MaxInterval: time.Second}, []string{"max_interval 1s is less than initial_interval 1m0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func BenchmarkRetryPolicyNext(b *testing.B) {
	p := DefaultRetryPolicy()
	t0 := time.Now()
	err := Retryable("http_503", time.Second, errors.New("x"))
	for i := 0; b.Loop(); i++ {
		p.Next(i%7+1, t0, t0, err, nil)
	}
}

// Printable removes what a terminal would execute (ESC sequences, BEL, C1
// controls such as CSI) from a receiver's text; an *Error's text is
// printable whatever its cause says.
func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text é", "plain text é"},
		{"Bad\x1b]0;pwned\x07Request", "Bad ]0;pwned Request"},
		{"\x1b[2Jcleared", " [2Jcleared"},
		{"csi\u009b2J and del\x7f", "csi 2J and del "},
		{"bad utf-8 \xff", "bad utf-8 \uFFFD"},
		{"tab\tnew\nline\r", "tab new line "},
	} {
		if got := Printable(tc.in); got != tc.want {
			t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	err := Permanent("http_400", errors.New("HTTP 400 Bad\x1b]0;pwned\x07\x1b[2J"))
	if got := err.Error(); strings.ContainsAny(got, "\x1b\x07") {
		t.Errorf("Error() = %q: control characters kept", got)
	}
}
