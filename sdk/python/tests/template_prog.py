"""A planner whose prompt comes from a versioned template (prompts/planner/v1.txt), sent to a
model through the proxy. Prints the prompt it used."""
import retrace

run = retrace.connect()
planner = run.agent("planner", role="planner", prompt_template="planner@v1")
prompt = planner.template(table="users")
reply = planner.openai().chat.completions.create(model="sim", messages=[{"role": "user", "content": prompt}])
planner.decide("plan", target=reply.choices[0].message.content[:0] + "table:users")
print(prompt)
run.finish(0)
