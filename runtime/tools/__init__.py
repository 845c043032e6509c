"""Tool calls: how each model family writes them, and the code that reads and enforces them.

    format   ToolFormat per family (markers, argument syntax), the registry
             ``--tool-call-parser NAME`` picks from, detection from a chat template
    plan     ToolPlan: the functions a request offers and its tool_choice, typed
    grammar  a ToolPlan in a ToolFormat -> a structural tag (xgrammar) or Lark (llguidance)
    parser   model output -> content and tool calls, whole or streamed
    prompt   tools in the prompt for chat templates that know nothing of them

Nothing here knows HTTP: the routes (``entrypoints/http/openai/tools.py``) check a
request's tools into a ToolPlan and turn refusals into 400s.
"""
