// Command functionurl is a Lambda function behind a function URL that a
// changegate webhook sink posts to. With the URL's AuthType AWS_IAM, the sink
// signs its requests with SigV4 (auth = "aws_sigv4", aws_service =
// "lambda") and Lambda checks them before the function runs; with AuthType
// NONE, set a secret on the sink and WEBHOOK_SECRET here, and the function
// checks the Standard Webhooks signature itself. Both can be combined.
package main

import (
	"context"
	"encoding/base64"
	"log"
	"net/http"
	"os"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/changegate/changegate/receive"
)

func main() {
	var verifier *receive.Verifier
	if s := os.Getenv("WEBHOOK_SECRET"); s != "" {
		v, err := receive.NewVerifier(s)
		if err != nil {
			log.Fatal(err)
		}
		verifier = v
	}
	lambda.Start(handler(verifier))
}

// handler returns the function's handler; verifier nil skips the Standard
// Webhooks check (AWS_IAM function URLs).
func handler(verifier *receive.Verifier) func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
	return func(ctx context.Context, req events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		body := []byte(req.Body)
		if req.IsBase64Encoded {
			b, err := base64.StdEncoding.DecodeString(req.Body)
			if err != nil {
				return events.LambdaFunctionURLResponse{StatusCode: http.StatusBadRequest}, nil
			}
			body = b
		}
		id := req.Headers["webhook-id"] // function URLs lower-case header names
		if verifier != nil {
			h := http.Header{}
			for k, v := range req.Headers {
				h.Set(k, v)
			}
			var err error
			if id, err = verifier.Verify(h, body); err != nil {
				return events.LambdaFunctionURLResponse{StatusCode: receive.StatusFor(err), Body: err.Error()}, nil
			}
		}
		envs, err := receive.DecodeBatch(body)
		if err != nil {
			// 400: changegate dead-letters the event rather than retrying.
			return events.LambdaFunctionURLResponse{StatusCode: http.StatusBadRequest, Body: err.Error()}, nil
		}
		for _, env := range envs {
			log.Printf("webhook-id %s: %s %s %s.%s key=%s", id, env.ID, env.OperationType, env.NS.DB, env.NS.Coll, env.DocumentKey)
		}
		// Any 2xx is delivered; 5xx, 408 and 429 are retried.
		return events.LambdaFunctionURLResponse{StatusCode: http.StatusOK}, nil
	}
}
