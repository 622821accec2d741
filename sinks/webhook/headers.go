package webhook

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/changegate/changegate/event"
)

// Headers of a document-form payload (envelope = "document"): the body is
// the post-image alone and the event's metadata travels in these (the id
// is HeaderID). A value that is not printable ASCII (a document key with
// other characters) is sent as "base64:" and the standard base64 of its
// UTF-8 bytes.
const (
	HeaderOperationType = "Changegate-Operation-Type"
	HeaderNamespace     = "Changegate-Namespace"
	HeaderDocumentKey   = "Changegate-Document-Key"
	HeaderClusterTime   = "Changegate-Cluster-Time"
	// HeaderTxn carries the "txn" object (compact JSON) of an event written
	// by a multi-document transaction.
	HeaderTxn = "Changegate-Txn"
)

// metaHeaders maps event.Event.Metadata names to headers.
var metaHeaders = map[string]string{
	"operationType": HeaderOperationType, "ns": HeaderNamespace,
	"documentKey": HeaderDocumentKey, "clusterTime": HeaderClusterTime, "txn": HeaderTxn,
}

// setMetaHeaders sets the metadata headers of a document-form payload.
func setMetaHeaders(h http.Header, e *event.Event) {
	for _, m := range e.Metadata() {
		name, ok := metaHeaders[m.Name]
		if !ok {
			continue
		}
		v := m.Value
		for i := 0; i < len(v); i++ {
			if v[i] < 0x20 || v[i] > 0x7e {
				v = "base64:" + base64.StdEncoding.EncodeToString([]byte(m.Value))
				break
			}
		}
		h[name] = []string{v}
	}
}

// reservedHeaders cannot be set through Config.Headers.
var reservedHeaders = map[string]bool{
	HeaderOperationType: true, HeaderNamespace: true, HeaderDocumentKey: true, HeaderClusterTime: true, HeaderTxn: true,
	HeaderID: true, HeaderTimestamp: true, HeaderSignature: true,
	"Content-Type": true, "Content-Length": true, "Transfer-Encoding": true,
	"Host": true, "Connection": true, "Te": true, "Upgrade": true, "Trailer": true,
}

// staticHeaders returns the headers every request carries, canonicalised
// and validated, so that requests copy them without further work.
func staticHeaders(cfg Config) (http.Header, error) {
	var errs []error
	h := http.Header{
		"Content-Type": {"application/json"},
		"User-Agent":   {DefaultUserAgent},
	}
	if cfg.UserAgent != "" {
		h["User-Agent"] = []string{cfg.UserAgent}
	}
	for name, value := range cfg.Headers {
		k := http.CanonicalHeaderKey(name)
		switch {
		case !validHeaderName(name):
			errs = append(errs, fmt.Errorf("headers: %q is not a valid header name", name))
			continue
		case reservedHeaders[k]:
			errs = append(errs, fmt.Errorf("headers: %s is set by the sink and cannot be overridden", k))
			continue
		case k == "Authorization" && (cfg.BearerToken != "" || cfg.BasicUser != ""):
			errs = append(errs, errors.New("headers: Authorization conflicts with bearer_token/basic auth"))
			continue
		case strings.ContainsAny(value, "\r\n\x00"):
			errs = append(errs, fmt.Errorf("headers: value of %s contains a line break or NUL", k))
			continue
		}
		h[k] = []string{value}
	}
	switch {
	case cfg.BearerToken != "":
		if strings.ContainsAny(cfg.BearerToken, "\r\n\x00") {
			errs = append(errs, errors.New("bearer_token contains a line break or NUL"))
		}
		h["Authorization"] = []string{"Bearer " + cfg.BearerToken}
	case cfg.BasicUser != "":
		if strings.Contains(cfg.BasicUser, ":") {
			errs = append(errs, errors.New("basic auth username must not contain ':'"))
		}
		h["Authorization"] = []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(cfg.BasicUser+":"+cfg.BasicPassword))}
	}
	return h, errors.Join(errs...)
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
