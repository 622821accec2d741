package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/changegate/changegate/sinks/internal/awsutil"
)

// SigV4 configures AWS Signature Version 4 signing of webhook requests, for
// a Lambda function URL with AuthType AWS_IAM (Service "lambda") or an
// IAM-protected API Gateway API ("execute-api").
//
// Each attempt is signed after the Standard Webhooks headers are set, so
// the signature covers them too: every header of the request but
// User-Agent (which the signer leaves out), the host, the body's length
// and its SHA-256, which is also sent as X-Amz-Content-Sha256 (function
// URLs require it for a request with a body). A transport retry is signed
// anew, like its webhook-signature.
type SigV4 struct {
	// Service is the signing name (required).
	Service string
	// Region is the signing region (required).
	Region string
	// RoleARN, when set, is assumed through STS on top of the credentials
	// of the default chain.
	RoleARN string
	// Credentials replaces the default credential chain (tests).
	Credentials aws.CredentialsProvider
}

// awsSigner signs requests with SigV4.
type awsSigner struct {
	signer  *v4.Signer
	creds   aws.CredentialsProvider
	service string
	region  string
	now     func() time.Time
}

// newAWSSigner returns the signer of cfg.SigV4 (nil when unset): it loads
// the credential chain (environment, shared files) without connecting.
func newAWSSigner(cfg Config) (*awsSigner, error) {
	s := cfg.SigV4
	if s == nil {
		return nil, nil
	}
	var errs []error
	if s.Service == "" {
		errs = append(errs, errors.New("sigv4: service is required"))
	}
	if s.Region == "" {
		errs = append(errs, errors.New("sigv4: region is required"))
	}
	if cfg.BearerToken != "" || cfg.BasicUser != "" {
		errs = append(errs, errors.New("sigv4: exclusive with bearer_token and basic auth"))
	}
	for k := range cfg.Headers {
		if ck := http.CanonicalHeaderKey(k); ck == "Authorization" || strings.HasPrefix(ck, "X-Amz-") {
			errs = append(errs, fmt.Errorf("headers: %s is set by sigv4", ck))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	awsCfg, err := awsutil.LoadConfig(awsutil.Options{Name: cfg.Name, Region: s.Region, RoleARN: s.RoleARN, Credentials: s.Credentials})
	if err != nil {
		return nil, fmt.Errorf("sigv4: %w", err)
	}
	if awsCfg.Credentials == nil {
		return nil, errors.New("sigv4: no credentials provider")
	}
	return &awsSigner{signer: v4.NewSigner(), creds: awsCfg.Credentials, service: s.Service, region: s.Region, now: time.Now}, nil
}

// sign sets X-Amz-Content-Sha256, X-Amz-Date, X-Amz-Security-Token (with
// temporary credentials) and Authorization on r, replacing those of an
// earlier attempt. r.Header must be r's own (not shared); r.URL may be
// shared (the sink's request template): it is not written.
//
// The SDK's signer rewrites the URL's query into its canonical form (sorted,
// re-encoded) as a side effect. The request keeps the query as configured,
// byte for byte: the signer works on a copy of the URL, and its canonical
// query is that of the configured one (both parse to the same parameters,
// which is what the receiver canonicalizes), so what is sent is what is
// signed. The path is signed as sent; config refuses paths that AWS would
// normalize first (dot segments, empty segments), see config.SigV4PathProblem.
func (s *awsSigner) sign(ctx context.Context, r *http.Request, hash string) error {
	creds, err := s.creds.Retrieve(ctx)
	if err != nil {
		return err
	}
	for _, k := range []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token"} {
		delete(r.Header, k)
	}
	r.Header["X-Amz-Content-Sha256"] = []string{hash}
	sent := r.URL
	u := *sent
	r.URL = &u
	err = s.signer.SignHTTP(ctx, creds, r, hash, s.service, s.region, s.now())
	r.URL = sent
	return err
}
