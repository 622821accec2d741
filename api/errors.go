package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// Error is the body of every error the admin server answers (the API's, the
// console's actions', the Host check's and the body limit's): a message,
// and, for a request refused for several reasons, each of them.
type Error struct {
	Error string `json:"error"`
	// Problems lists the reasons one by one (a rejected reload: each
	// configuration error).
	Problems []string `json:"problems,omitempty"`
}

// WriteError answers code with the Error {"error": msg}.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, Error{Error: msg})
}

// Refusal returns the Error of err: for an error wrapping a sentinel
// (fmt.Errorf("%w: ...", ErrX), fmt.Errorf("%w:\n...", ErrX)) the
// sentinel's text is the message and each non-empty line of the rest a
// problem; another error is its text alone.
func Refusal(err error) Error {
	sentinel := errors.Unwrap(err)
	if sentinel == nil {
		return Error{Error: err.Error()}
	}
	msg := strings.TrimLeft(strings.TrimPrefix(err.Error(), sentinel.Error()), ":\n ")
	e := Error{Error: sentinel.Error()}
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			e.Problems = append(e.Problems, l)
		}
	}
	return e
}

// WriteJSON answers code with v as indented JSON.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
