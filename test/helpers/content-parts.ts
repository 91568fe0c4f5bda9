/**
 * Chat content parts as vLLM's OpenAI server reads them (vllm/entrypoints/chat_utils.py at
 * commit 001eadcf295d): the shapes it takes beyond OpenAI's own, which every place messages
 * enter must take too, and the shapes it refuses, which each must refuse with a 400 naming
 * the field.
 */

/** One content part vLLM takes, and what it is. */
export const VLLM_PARTS: ReadonlyArray<{ name: string; part: unknown }> = [
  { name: 'a plain string, read as text', part: 'plain string part' },
  { name: 'a thinking part', part: { type: 'thinking', thinking: 'hmm', closed: true } },
  { name: 'an output_text part', part: { type: 'output_text', text: 'a' } },
  { name: 'an input_text part', part: { type: 'input_text', text: 'a' } },
  { name: 'a refusal part', part: { type: 'refusal', refusal: 'no' } },
  { name: 'a text part with text null (skipped)', part: { type: 'text', text: null } },
  { name: 'an audio_embeds part', part: { type: 'audio_embeds', audio_embeds: 'AAAA' } },
  { name: 'an image_embeds part', part: { type: 'image_embeds', image_embeds: { image_embeds: 'AAAA' } } },
  { name: 'a prompt_embeds part', part: { type: 'prompt_embeds', data: 'AAAA' } },
  { name: 'a tool_reference part', part: { type: 'tool_reference', name: 'get_weather' } },
  { name: 'an input_image part', part: { type: 'input_image', image_url: 'https://x/y.png' } },
  { name: 'an input_audio part', part: { type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } } },
  {
    name: 'an image_url part with detail',
    part: { type: 'image_url', image_url: { url: 'https://x/y.png', detail: 'high' } },
  },
  { name: 'an audio_url part', part: { type: 'audio_url', audio_url: { url: 'https://x/a.wav' } } },
  { name: 'a video_url part', part: { type: 'video_url', video_url: { url: 'https://x/v.mp4' } } },
  { name: 'an image_url part without a type', part: { image_url: 'https://x/y.png' } },
  { name: 'an image_url {url} part without a type', part: { image_url: { url: 'https://x/y.png' } } },
  { name: 'an audio_url part without a type', part: { audio_url: 'https://x/a.wav' } },
  { name: 'a video_url part without a type', part: { video_url: 'https://x/v.mp4' } },
  { name: 'an input_audio part without a type', part: { input_audio: { data: 'AAAA', format: 'wav' } } },
  { name: 'a part whose type is null', part: { type: null, image_url: 'https://x/y.png' } },
  { name: 'a cached image by uuid, its media null', part: { type: 'image_url', image_url: null, uuid: 'img-1' } },
  { name: 'a cached image by uuid, no type', part: { image_url: null, uuid: 'img-1' } },
  { name: 'a cached video by uuid, url null', part: { type: 'video_url', video_url: { url: null }, uuid: 'vid-1' } },
  {
    name: 'an image with both url and uuid',
    part: { type: 'image_url', image_url: { url: 'https://x/y.png' }, uuid: 'u1' },
  },
  { name: 'a cached PIL image by uuid', part: { type: 'image_pil', image_pil: null, uuid: 'img-2' } },
  { name: 'a cached audio embedding by uuid', part: { type: 'audio_embeds', audio_embeds: null, uuid: 'aud-1' } },
  { name: 'a text part with a null uuid', part: { type: 'text', text: 'hi', uuid: null } },
];

/** One content part vLLM refuses, the field the refusal names, and its message. */
export const REFUSED_PARTS: ReadonlyArray<{ part: unknown; field: string; message: string | RegExp }> = [
  { part: 5, field: '', message: ' must be a string or a content part object' },
  { part: null, field: '', message: ' must be a string or a content part object' },
  { part: { type: 'evil' }, field: '.type', message: /\.type must be one of text, thinking, /u },
  { part: { type: 3, text: 'x' }, field: '.type', message: '.type must be a string' },
  { part: { text: 'no type' }, field: '.type', message: /\.type is missing and no media field .*image_url/u },
  { part: { type: 'text', text: 5 }, field: '.text', message: '.text must be a string' },
  { part: { type: 'input_text', text: null }, field: '.text', message: '.text must be a string' },
  { part: { type: 'thinking', thinking: 5 }, field: '.thinking', message: '.thinking must be a string' },
  { part: { type: 'refusal', refusal: {} }, field: '.refusal', message: '.refusal must be a string' },
  { part: { type: 'tool_reference' }, field: '.name', message: '.name must be a string' },
  { part: { type: 'prompt_embeds' }, field: '.data', message: '.data must be a non-empty string' },
  {
    part: { type: 'image_url', image_url: { href: 'x' } },
    field: '.image_url',
    message: '.image_url must be a URL string or {url}',
  },
  {
    part: { type: 'image_url', image_url: null },
    field: '.image_url',
    message: /\.image_url must be a URL string or \{url\}.*uuid/u,
  },
  {
    part: { type: 'audio_url', audio_url: 5 },
    field: '.audio_url',
    message: '.audio_url must be a URL string or {url}',
  },
  { part: { type: 'video_url' }, field: '.video_url', message: '.video_url must be a URL string or {url}' },
  { part: { image_url: null }, field: '.image_url', message: /\.image_url must be a URL string or \{url\}.*uuid/u },
  {
    part: { type: 'image_url', image_url: 'https://x/y.png', uuid: 5 },
    field: '.uuid',
    message: '.uuid must be a string',
  },
  {
    part: { type: 'text', text: 'hi', uuid: 'u1' },
    field: '.uuid',
    message: /\.uuid names a media item but the part has no media field/u,
  },
];
