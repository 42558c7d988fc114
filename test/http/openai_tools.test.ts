// Agent frameworks send tool definitions with every request. The official
// `openai` client, pointed at the trained demo model on both OpenAI-shaped
// families, gets exactly the reply the same request gets without them:
// the fields are accepted and ignored, and no tool call is ever made up.
// A JSON response format beside them constrains the reply all the same.
import { beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { serverForTests } from "../helpers/server.ts";

const MODEL = "demo";
const FAMILIES = ["v1", "api/v0"];
const MESSAGES: OpenAI.Chat.ChatCompletionMessageParam[] = [
  { role: "system", content: "Answer as the scripture does." },
  { role: "user", content: "Who made the heaven and the earth?" },
];

const TOOLS: OpenAI.Chat.ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "lookup_verse",
      description: "Looks a verse up by its reference",
      parameters: { type: "object", properties: { reference: { type: "string" } }, required: ["reference"] },
    },
  },
];

/** Every tool-calling field a client may send, asking for calls in earnest. */
const TOOL_FIELDS: Pick<OpenAI.Chat.ChatCompletionCreateParams, "tools" | "tool_choice" | "parallel_tool_calls" | "functions" | "function_call"> = {
  tools: TOOLS,
  tool_choice: "required",
  parallel_tool_calls: true,
  functions: [{ name: "lookup_verse", parameters: { type: "object" } }],
  function_call: "auto",
};

const server = serverForTests({ modelPath: TRAINED_MODEL_PATH, env: { SERVICE_MAX_SEQ_LEN: "512" } });
const clients = new Map<string, OpenAI>();

beforeAll(() => {
  // Any API key: the service ignores it without SERVICE_API_KEY. No retries, so a failure shows at once.
  for (const family of FAMILIES) clients.set(family, new OpenAI({ baseURL: `${server.url}/${family}`, apiKey: "sk-not-checked", maxRetries: 0 }));
});

/** A reply without what differs between any two requests (id, created, timings). */
function reply(r: OpenAI.Chat.ChatCompletion | OpenAI.Completion) {
  return { model: r.model, choices: r.choices, usage: r.usage };
}

describe("tool-calling fields through the openai client, on the trained model", () => {
  for (const family of FAMILIES) {
    const client = () => clients.get(family)!;
    test(`/${family} chat: greedy and sampled replies with tools equal the replies without`, async () => {
      for (const sampling of [{ temperature: 0 }, { temperature: 0.8, seed: 11 }]) {
        const request = { model: MODEL, messages: MESSAGES, max_tokens: 24, ...sampling };
        const plain = await client().chat.completions.create(request);
        const withTools = await client().chat.completions.create({ ...request, ...TOOL_FIELDS });
        expect(reply(withTools)).toEqual(reply(plain));
        expect(withTools.choices[0].message.tool_calls).toBeUndefined();
        expect(withTools.choices[0].finish_reason).not.toBe("tool_calls");
        expect(withTools.choices[0].message.content?.length).toBeGreaterThan(0);
      }
    });

    test(`/${family} chat stream: the streamed text with tools equals the text without`, async () => {
      const request = { model: MODEL, messages: MESSAGES, max_tokens: 24, temperature: 0, stream: true } as const;
      const texts: string[] = [];
      for (const extra of [{}, TOOL_FIELDS]) {
        let text = "";
        for await (const chunk of await client().chat.completions.create({ ...request, ...extra })) {
          expect(chunk.choices[0]?.delta.tool_calls).toBeUndefined();
          text += chunk.choices[0]?.delta.content ?? "";
        }
        texts.push(text);
      }
      expect(texts[0].length).toBeGreaterThan(0);
      expect(texts[1]).toBe(texts[0]);
    });

    test(`/${family} text completion: the reply with tool fields equals the reply without`, async () => {
      const request = { model: MODEL, prompt: "And God said unto Moses,", max_tokens: 24, temperature: 0 };
      const plain = await client().completions.create(request);
      const withTools = await client().completions.create({ ...request, ...TOOL_FIELDS });
      expect(reply(withTools)).toEqual(reply(plain));
    });

    test(`/${family}: a JSON response format beside the tool fields shapes the reply, the tools still ignored`, async () => {
      const schema = { type: "object", properties: { answer: { enum: ["God", "Moses", "Pharaoh"] } }, required: ["answer"] };
      const format = { type: "json_schema", json_schema: { name: "answer", schema, strict: true } } as const;
      const ask = (extra: object) => client().chat.completions.create({ model: MODEL, messages: MESSAGES, response_format: format, max_tokens: 40, temperature: 0, ...extra });
      const [withTools, plain] = await Promise.all([ask(TOOL_FIELDS), ask({})]);
      expect(withTools.choices[0].finish_reason).toBe("stop");
      expect(["God", "Moses", "Pharaoh"]).toContain(JSON.parse(withTools.choices[0].message.content as string).answer);
      expect(withTools.choices[0].message.content).toBe(plain.choices[0].message.content);
      expect(withTools.choices[0].message.tool_calls ?? []).toEqual([]);
    });
  }
});
