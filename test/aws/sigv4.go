package awstest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/smithy-go/encoding/httpbinding"
)

// authKind says why a request failed authentication; each service maps it to
// its own error shape.
type authKind int

const (
	authMissing    authKind = iota + 1 // no Authorization header
	authIncomplete                     // Authorization header present but malformed
	authUnknownKey                     // access key id not known
	authMismatch                       // signature, scope or payload hash does not match
	authExpired                        // X-Amz-Date too far from the server clock
)

type authError struct {
	kind authKind
	msg  string
}

const (
	sigV4Algorithm = "AWS4-HMAC-SHA256"
	amzDateFormat  = "20060102T150405Z"
)

// verifySigV4 recomputes the AWS Signature Version 4 of r (whose body has
// already been read into body) independently of the SDK's signer and compares
// it to the Authorization header. It returns nil when the signature is valid.
func verifySigV4(r *http.Request, body []byte, o Options, service string, now time.Time) *authError {
	authz := r.Header.Get("Authorization")
	if authz == "" {
		return &authError{authMissing, "Missing Authentication Token"}
	}
	rest, ok := strings.CutPrefix(authz, sigV4Algorithm+" ")
	if !ok {
		return &authError{authIncomplete, "Authorization header requires the " + sigV4Algorithm + " algorithm."}
	}
	var credential, signedHeaders, signature string
	for part := range strings.SplitSeq(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			credential = v
		case "SignedHeaders":
			signedHeaders = v
		case "Signature":
			signature = v
		}
	}
	if credential == "" || signedHeaders == "" || signature == "" {
		return &authError{authIncomplete, "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters. Authorization=" + authz}
	}
	// Credential=AKID/yyyymmdd/region/service/aws4_request
	scope := strings.Split(credential, "/")
	if len(scope) != 5 || scope[4] != "aws4_request" {
		return &authError{authIncomplete, "Credential should be scoped to a valid region, service and terminator. Credential=" + credential}
	}
	if scope[0] != o.AccessKey {
		return &authError{authUnknownKey, "The security token included in the request is invalid."}
	}

	amzDate := r.Header.Get("X-Amz-Date")
	t, err := time.Parse(amzDateFormat, amzDate)
	if err != nil {
		return &authError{authIncomplete, "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."}
	}
	if d := now.Sub(t); d > o.MaxClockSkew || d < -o.MaxClockSkew {
		if d > 0 {
			return &authError{authExpired, fmt.Sprintf("Signature expired: %s is now earlier than %s (%s - %s.)",
				amzDate, now.Add(-o.MaxClockSkew).UTC().Format(amzDateFormat), now.UTC().Format(amzDateFormat), o.MaxClockSkew)}
		}
		return &authError{authExpired, fmt.Sprintf("Signature not yet current: %s is still later than %s (%s + %s.)",
			amzDate, now.Add(o.MaxClockSkew).UTC().Format(amzDateFormat), now.UTC().Format(amzDateFormat), o.MaxClockSkew)}
	}
	if scope[1] != amzDate[:8] {
		return &authError{authMismatch, fmt.Sprintf("Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: '%s' != '%s', from '%s'.", scope[1], amzDate[:8], amzDate)}
	}
	if scope[2] != o.Region {
		return &authError{authMismatch, fmt.Sprintf("Credential should be scoped to a valid region, not '%s'.", scope[2])}
	}
	if scope[3] != service {
		return &authError{authMismatch, fmt.Sprintf("Credential should be scoped to correct service: '%s'.", service)}
	}

	names := strings.Split(signedHeaders, ";")
	if !sort.StringsAreSorted(names) {
		return &authError{authIncomplete, "SignedHeaders must be sorted: " + signedHeaders}
	}
	hasHost, hasDate := false, false
	for _, n := range names {
		hasHost = hasHost || n == "host"
		hasDate = hasDate || n == "x-amz-date"
	}
	if !hasHost || !hasDate {
		return &authError{authMismatch, "'Host' and 'X-Amz-Date' must be signed headers. SignedHeaders=" + signedHeaders}
	}

	payloadHash := sha256Hex(body)
	if h := r.Header.Get("X-Amz-Content-Sha256"); h != "" && h != "UNSIGNED-PAYLOAD" {
		if h != payloadHash {
			return &authError{authMismatch, "The provided 'x-amz-content-sha256' header does not match what was computed."}
		}
	} else if h == "UNSIGNED-PAYLOAD" {
		payloadHash = h
	}

	var canonicalHeaders strings.Builder
	for _, n := range names {
		var values []string
		switch n {
		case "host":
			values = []string{r.Host}
		case "content-length":
			if v := r.Header.Values("Content-Length"); len(v) > 0 {
				values = v
			} else {
				values = []string{strconv.FormatInt(r.ContentLength, 10)}
			}
		default:
			values = r.Header.Values(n)
		}
		canonicalHeaders.WriteString(n)
		canonicalHeaders.WriteByte(':')
		for i, v := range values {
			if i > 0 {
				canonicalHeaders.WriteByte(',')
			}
			canonicalHeaders.WriteString(strings.TrimSpace(stripExcessSpaces(v)))
		}
		canonicalHeaders.WriteByte('\n')
	}

	uri := r.URL.EscapedPath()
	if uri == "" {
		uri = "/"
	}
	canonicalRequest := strings.Join([]string{
		r.Method,
		httpbinding.EscapePath(uri, false),
		canonicalQuery(r.URL.Query()),
		canonicalHeaders.String(),
		signedHeaders,
		payloadHash,
	}, "\n")

	credentialScope := strings.Join(scope[1:], "/")
	stringToSign := strings.Join([]string{sigV4Algorithm, amzDate, credentialScope, sha256Hex([]byte(canonicalRequest))}, "\n")

	key := hmacSHA256([]byte("AWS4"+o.SecretKey), scope[1])
	key = hmacSHA256(key, scope[2])
	key = hmacSHA256(key, scope[3])
	key = hmacSHA256(key, "aws4_request")
	want := hex.EncodeToString(hmacSHA256(key, stringToSign))
	if !hmac.Equal([]byte(want), []byte(signature)) {
		return &authError{authMismatch, "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details."}
	}
	return nil
}

func canonicalQuery(q url.Values) string {
	type kv struct{ k, v string }
	var params []kv
	for k, vs := range q {
		for _, v := range vs {
			params = append(params, kv{queryEscape(k), queryEscape(v)})
		}
	}
	sort.Slice(params, func(i, j int) bool {
		if params[i].k != params[j].k {
			return params[i].k < params[j].k
		}
		return params[i].v < params[j].v
	})
	var b strings.Builder
	for i, p := range params {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(p.k)
		b.WriteByte('=')
		b.WriteString(p.v)
	}
	return b.String()
}

func queryEscape(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }

// stripExcessSpaces collapses runs of spaces into one, as SigV4 requires for
// canonical header values.
func stripExcessSpaces(s string) string {
	if !strings.Contains(s, "  ") {
		return s
	}
	var b strings.Builder
	prevSpace := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == ' ' {
			if prevSpace {
				continue
			}
			prevSpace = true
		} else {
			prevSpace = false
		}
		b.WriteByte(c)
	}
	return b.String()
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func hmacSHA256(key []byte, data string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(data))
	return h.Sum(nil)
}

// VerifySigV4 checks the AWS Signature Version 4 of r, whose body has been
// read into body, as the test servers do: the signature is recomputed with
// o's credentials (defaults filled in) for the given signing name (for
// example "lambda" for a function URL, "execute-api" for API Gateway) and
// region, and X-Amz-Date must be within o.MaxClockSkew of o.Now(). It
// returns nil when the signature is valid, otherwise an error saying why,
// worded as AWS words it. Receivers of SigV4-signed webhooks use it.
func VerifySigV4(r *http.Request, body []byte, o Options, service string) error {
	o = o.withDefaults()
	if ae := verifySigV4(r, body, o, service, o.Now()); ae != nil {
		return fmt.Errorf("sigv4: %s", ae.msg)
	}
	return nil
}
