package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/changegate/changegate/receive"
	"github.com/changegate/changegate/sinks/webhook"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func TestFunctionURL(t *testing.T) {
	v, err := receive.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := handler(v)
	body := `{"id":"jobs:82AB","source":"jobs","operationType":"insert","ns":{"db":"app","coll":"jobs"},"documentKey":{"_id":"job-1"},"rules":["start"]}`
	now := time.Now()
	sig, err := webhook.Sign([]string{secret}, "jobs:82AB", now, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	req := events.LambdaFunctionURLRequest{
		Headers: map[string]string{"webhook-id": "jobs:82AB", "webhook-timestamp": strconv.FormatInt(now.Unix(), 10), "webhook-signature": sig},
		Body:    base64.StdEncoding.EncodeToString([]byte(body)), IsBase64Encoded: true,
	}
	if resp, _ := h(context.Background(), req); resp.StatusCode != http.StatusOK {
		t.Fatalf("signed request: %d %s", resp.StatusCode, resp.Body)
	}
	req.Body, req.IsBase64Encoded = body[:len(body)-1]+`,"x":1}`, false
	if resp, _ := h(context.Background(), req); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("tampered request: %d, want 401", resp.StatusCode)
	}
}
