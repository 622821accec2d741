package awsutil

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/smithy-go/middleware"
)

func TestClientOptions(t *testing.T) {
	var r aws.Retryer
	env := aws.String("http://from-env")
	base := env
	var opts []func(*middleware.Stack) error
	ClientOptions(&r, &base, &opts, "")
	if r == nil || r.MaxAttempts() != transportAttempts {
		t.Fatalf("retryer = %v, want ServiceRetryer", r)
	}
	if base != env {
		t.Fatalf("empty endpoint replaced BaseEndpoint with %v", base)
	}
	ClientOptions(&r, &base, &opts, "http://127.0.0.1:1")
	if base == nil || *base != "http://127.0.0.1:1" {
		t.Fatalf("BaseEndpoint = %v, want the endpoint option", base)
	}
}
