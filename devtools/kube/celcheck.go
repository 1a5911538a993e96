package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

// celResult is what cel-check answers for one expression: the real DRA compiler's verdict
// and its worst-case cost estimate, against the API's per-selector limit.
type celResult struct {
	Expression string `json:"expression"`
	Error      string `json:"error,omitempty"`
	MaxCost    uint64 `json:"max_cost"`
	CostLimit  uint64 `json:"cost_limit"`
}

// runCELCheck reads a JSON list of selector expressions and compiles each as the apiserver
// does when it validates a ResourceClaim (stored expressions, the default features).
func runCELCheck(in io.Reader, out io.Writer) int {
	var expressions []string
	if err := json.NewDecoder(in).Decode(&expressions); err != nil {
		fmt.Fprintf(os.Stderr, "cel-check: stdin is not a JSON list of strings: %v\n", err)
		return 2
	}
	compiler := dracel.GetCompiler(dracel.Features{})
	results := make([]celResult, 0, len(expressions))
	for _, expression := range expressions {
		compiled := compiler.CompileCELExpression(expression, dracel.Options{})
		result := celResult{Expression: expression, MaxCost: compiled.MaxCost, CostLimit: resourceapi.CELSelectorExpressionMaxCost}
		if compiled.Error != nil {
			result.Error = compiled.Error.Error()
		}
		results = append(results, result)
	}
	encoder := json.NewEncoder(out)
	encoder.SetIndent("", "  ")
	if err := encoder.Encode(results); err != nil {
		fmt.Fprintf(os.Stderr, "cel-check: %v\n", err)
		return 1
	}
	return 0
}
