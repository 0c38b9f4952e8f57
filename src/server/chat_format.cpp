#include "server/chat_format.h"

#include "core/error.h"
#include "runtime/tokenizer.h"

namespace sparrow::server {

namespace {

// out += each part (g++ 12 warns falsely about chains of std::string operator+).
void append(std::string &out, std::initializer_list<std::string_view> parts) {
    for (std::string_view p : parts) out.append(p);
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Python's str.strip() over ASCII whitespace (what the templates' .strip() does for the text we see).
std::string_view strip(std::string_view s) {
    constexpr std::string_view ws = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string_view rstrip_newlines(std::string_view s) {
    while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
    return s;
}

std::string_view lstrip_newlines(std::string_view s) {
    while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
    return s;
}

std::string normalized_role(const ChatMessage &m) {
    if (m.role == "developer") return "system";
    if (m.role == "system" || m.role == "user" || m.role == "assistant") return m.role;
    throw_error("unsupported message role '%s' (expected system, user or assistant)", m.role.c_str());
}

// Index of the last user turn, or -1.
ptrdiff_t last_user_index(const std::vector<ChatMessage> &messages) {
    ptrdiff_t last = -1;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (normalized_role(messages[i]) == "user") last = static_cast<ptrdiff_t>(i);
    }
    return last;
}

// Every system message's content, joined by blank lines (both DeepSeek templates put it right after BOS).
std::string joined_system_prompt(const std::vector<ChatMessage> &messages) {
    std::string joined;
    bool first = true;
    for (const ChatMessage &m : messages) {
        if (normalized_role(m) != "system") continue;
        if (!first) joined += "\n\n";
        joined += m.content;
        first = false;
    }
    return joined;
}

// deepseek-ai-DeepSeek-V3.2.jinja: BOS, then every system message joined by blank lines, then the turns.
// An assistant turn directly after a user turn opens with <｜Assistant｜> and the thinking block (only the
// closing tag when thinking is off or the turn precedes the last user message); each ends with EOS.
std::string render_deepseek3(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    const bool thinking = opts.enable_thinking.value_or(false);
    const ptrdiff_t last_user = last_user_index(messages);
    std::string out = opts.bos_text + joined_system_prompt(messages);
    bool pending_assistant_marker = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage &m = messages[i];
        const std::string role = normalized_role(m);
        if (role == "user") {
            append(out, {"<｜User｜>", m.content});
            pending_assistant_marker = true;
        } else if (role == "assistant") {
            if (pending_assistant_marker) {
                out += "<｜Assistant｜>";
                if (static_cast<ptrdiff_t>(i) > last_user && thinking) {
                    append(out, {"<think>", m.reasoning_content.value_or(""), "</think>"});
                } else {
                    out += "</think>";
                }
            }
            pending_assistant_marker = false;
            append(out, {m.content, "<｜end▁of▁sentence｜>"});
        }
    }
    if (opts.add_generation_prompt && pending_assistant_marker) {
        out += thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜><think></think>";
    }
    return out;
}

// deepseek-ai-DeepSeek-V4.jinja: BOS and the joined system messages as in V3.2; consecutive user turns share
// one <｜User｜> (joined by blank lines); every assistant turn opens with <｜Assistant｜> and keeps its thinking
// only after the last user turn with thinking on; the generation prompt follows whatever came last.
std::string render_deepseek4(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    const bool thinking = opts.enable_thinking.value_or(false);
    const ptrdiff_t last_user = last_user_index(messages);
    std::string out = opts.bos_text + joined_system_prompt(messages);
    bool in_user = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage &m = messages[i];
        const std::string role = normalized_role(m);
        if (role == "user") {
            out += in_user ? "\n\n" : "<｜User｜>";
            in_user = true;
            out += m.content;
        } else if (role == "assistant") {
            in_user = false;
            out += "<｜Assistant｜>";
            if (thinking && static_cast<ptrdiff_t>(i) > last_user) {
                append(out, {"<think>", m.reasoning_content.value_or(""), "</think>"});
            } else {
                out += "</think>";
            }
            append(out, {m.content, "<｜end▁of▁sentence｜>"});
        }
    }
    if (opts.add_generation_prompt) out += thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜></think>";
    return out;
}

// GLM-4.7-Flash.jinja (HF rendering: trim_blocks, lstrip_blocks): [gMASK]<sop>, then each turn as its tag
// and text; an assistant turn carries its thinking (only after the last user turn) or an empty </think>,
// then its stripped text. The generation prompt opens the thinking block unless thinking is disabled.
std::string render_glm(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    const ptrdiff_t last_user = last_user_index(messages);
    std::string out = "[gMASK]<sop>";
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage &m = messages[i];
        const std::string role = normalized_role(m);
        if (role == "user") {
            append(out, {"<|user|>", m.content});
        } else if (role == "system") {
            append(out, {"<|system|>", m.content});
        } else {
            out += "<|assistant|>";
            std::string_view content = m.content;
            std::string reasoning;
            if (m.reasoning_content) {
                reasoning = *m.reasoning_content;
            } else if (contains(content, "</think>")) {
                // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
                std::string_view before = rstrip_newlines(content.substr(0, content.find("</think>")));
                const size_t open = before.rfind("<think>");
                if (open != std::string_view::npos) before = before.substr(open + 7);
                reasoning = std::string(lstrip_newlines(before));
                // content.split('</think>')[-1].lstrip('\n')
                content = lstrip_newlines(content.substr(content.rfind("</think>") + 8));
            }
            if (static_cast<ptrdiff_t>(i) > last_user && !reasoning.empty()) {
                append(out, {"<think>", strip(reasoning), "</think>"});
            } else {
                out += "</think>";
            }
            out += strip(content);
        }
    }
    if (opts.add_generation_prompt) {
        const bool thinking_off = opts.enable_thinking.has_value() && !*opts.enable_thinking;
        out += thinking_off ? "<|assistant|></think>" : "<|assistant|><think>";
    }
    return out;
}

// Meta's Llama-2 chat template: an optional leading system message folded into the first user turn;
// user turns as BOS "[INST] text [/INST]", assistant turns as " text EOS". No generation prompt.
std::string render_llama2(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    size_t first = 0;
    std::string system;
    bool has_system = false;
    if (!messages.empty() && normalized_role(messages[0]) == "system") {
        system = messages[0].content;
        has_system = true;
        first = 1;
    }
    // The template renders a system message only inside the first user turn: without one, nothing would be said.
    if (first == messages.size()) throw_error("the llama2 chat format needs a user message after the system message");
    std::string out;
    for (size_t i = first; i < messages.size(); ++i) {
        const std::string role = normalized_role(messages[i]);
        // As the template: turns must alternate user/other; a later system message takes an assistant's
        // place and renders nothing.
        const bool expect_user = (i - first) % 2 == 0;
        if ((role == "user") != expect_user) {
            throw_error(
                "the llama2 chat format needs roles alternating user/assistant/user/... (after an optional "
                "system message); message %zu is '%s'",
                i, messages[i].role.c_str());
        }
        std::string content = messages[i].content;
        if (i == first && has_system) {
            std::string with_system;
            append(with_system, {"<<SYS>>\n", system, "\n<</SYS>>\n\n", content});
            content = std::move(with_system);
        }
        if (role == "user") {
            append(out, {opts.bos_text, "[INST] ", strip(content), " [/INST]"});
        } else if (role == "assistant") {
            append(out, {" ", strip(content), " ", opts.eos_text});
        }
    }
    return out;
}

}  // namespace

ChatOptions chat_options_for(const Tokenizer &tok) {
    ChatOptions opts;
    if (tok.bos_id() >= 0) opts.bos_text = std::string(tok.token_text(tok.bos_id()));
    if (tok.eos_id() >= 0) opts.eos_text = std::string(tok.token_text(tok.eos_id()));
    return opts;
}

std::optional<ChatFormat> detect_chat_format(std::string_view t) {
    if (contains(t, "<｜User｜>") && contains(t, "<｜Assistant｜>")) {
        // V4 merges consecutive user turns (its state.in_user) and has drop_thinking; V3.2 has neither.
        return contains(t, "drop_thinking") || contains(t, "in_user") ? ChatFormat::deepseek4 : ChatFormat::deepseek3;
    }
    if (contains(t, "[gMASK]<sop>") || (contains(t, "<|user|>") && contains(t, "<|assistant|>"))) {
        return ChatFormat::glm;
    }
    if (contains(t, "[INST]") && contains(t, "[/INST]")) return ChatFormat::llama2;
    return std::nullopt;
}

ChatFormat chat_format_from_name(std::string_view name) {
    if (name == "deepseek3" || name == "deepseek-v3.2") return ChatFormat::deepseek3;
    if (name == "deepseek4" || name == "deepseek-v4") return ChatFormat::deepseek4;
    if (name == "glm" || name == "glm-5" || name == "glm4") return ChatFormat::glm;
    if (name == "llama2") return ChatFormat::llama2;
    throw_error("unknown chat format '%.*s' (expected deepseek3, deepseek4, glm or llama2)", (int)name.size(),
                name.data());
}

const char *chat_format_name(ChatFormat f) {
    switch (f) {
        case ChatFormat::deepseek3: return "deepseek3";
        case ChatFormat::deepseek4: return "deepseek4";
        case ChatFormat::glm: return "glm";
        case ChatFormat::llama2: return "llama2";
    }
    return "?";
}

std::string apply_chat_format(ChatFormat f, const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    switch (f) {
        case ChatFormat::deepseek3: return render_deepseek3(messages, opts);
        case ChatFormat::deepseek4: return render_deepseek4(messages, opts);
        case ChatFormat::glm: return render_glm(messages, opts);
        case ChatFormat::llama2: return render_llama2(messages, opts);
    }
    throw_error("unknown chat format");
}

}  // namespace sparrow::server
